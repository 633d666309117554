#!/usr/bin/env bash
# One H200 (or any CUDA GPU), under 10 minutes, no internet: build the CUDA kernel, check the Triton and
# CUDA backends against the torch reference, measure decode-attention bandwidth, profile llama3-8b (dummy
# weights, bf16). Results land under $OUT (default ./out):
#   run.log, env.txt, kernel_tests.txt, attention_bandwidth.csv/.txt, profile_llama3-8b_<gpu>.csv/.json
# Run from anywhere:  OUT=/some/dir bash bench/gpu/run.sh
# Each stage has its own time limit, cut to what is left of a 570 s budget; a failed stage is reported
# and the next one still runs.

set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
exec > >(tee "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # real kernels here
START=$SECONDS
DEADLINE=$((START + 570))
FAILED=()

stage() { echo; echo "=== [$((SECONDS - START))s] $*"; }
run_stage() {  # run_stage NAME LIMIT_S CMD...: time-limited, failure recorded, never aborts the script
    local name=$1 limit=$2 rc; shift 2
    local left=$((DEADLINE - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -le 5 ]; then
        echo "!!! stage '$name' skipped: out of time"; FAILED+=("$name"); return
    fi
    stage "$name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "!!! stage '$name' failed (exit $rc$([ "$rc" -eq 124 ] && echo ', time limit'))"
        FAILED+=("$name")
    fi
}

# --- 1. the system python must already have a CUDA torch (and triton); nothing is downloaded
PY_SYS="${PYTHON:-$(command -v python3 || command -v python)}"
stage "environment ($PY_SYS)"
if ! "$PY_SYS" -c 'import torch' 2>/dev/null; then
    echo "no torch in $PY_SYS: this script needs torch with CUDA preinstalled"; exit 1
fi
"$PY_SYS" - <<'EOF' | tee "$OUT/env.txt"
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else "NONE")
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton MISSING")
EOF
"$PY_SYS" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || { echo "no GPU"; exit 1; }
{ nvidia-smi || true; command -v nvcc && nvcc --version || echo "nvcc MISSING"; } >> "$OUT/env.txt" 2>&1

# --- 2. a venv over the system packages; the project itself from this checkout, offline
VENV="${SLOPILOT_GPU_VENV:-$HOME/.cache/slopilot/venv-gpu}"
stage "venv $VENV"
mkdir -p "$(dirname "$VENV")"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY_SYS" -m venv --system-site-packages "$VENV" || { echo "venv failed"; exit 1; }
fi
PY="$VENV/bin/python"
# --no-deps --no-index: only what is already installed is used; the editable install runs setup.py,
# which also prebuilds the CUDA kernel when nvcc is present. Without setuptools, PYTHONPATH does.
if ! timeout 150 "$PY" -m pip install -q --no-deps --no-index --no-build-isolation -e "$ROOT"; then
    echo "editable install failed: using PYTHONPATH=$ROOT"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
for mod in numpy rich pytest; do
    "$PY" -c "import $mod" 2>/dev/null || echo "note: python module '$mod' missing on this machine"
done
HAVE_PYTEST=0; "$PY" -c 'import pytest' 2>/dev/null && HAVE_PYTEST=1
HAVE_RICH=0; "$PY" -c 'import rich' 2>/dev/null && HAVE_RICH=1

# --- 3. the CUDA kernel for this GPU's architecture (cached by source hash)
run_stage "build csrc/paged_attention.cu" 120 "$PY" -c '
import time, torch
from engine.attention import cuda_backend
t = time.time(); lib = cuda_backend.get_library()
print("paged attention library ready in %.1fs, partition %d" % (time.time() - t, lib.slopilot_partition_size()))'

# --- 4. kernels against the torch reference, on the GPU (fresh random inputs; float32, bf16, fp16)
if [ "$HAVE_PYTEST" = 1 ]; then
    run_stage "kernel tests" 150 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" \
        tests/engine/test_kernels_triton.py tests/engine/test_kernels_cuda.py --junitxml="$OUT/kernel_tests.xml"
else
    echo "pytest missing: the bandwidth stage still checks both backends against the reference"
fi

# --- 5. decode bandwidth: KV bytes read / kernel time vs a device-to-device copy, both backends
run_stage "attention bandwidth" 120 "$PY" bench/gpu/attention_bandwidth.py \
    --out "$OUT/attention_bandwidth.csv"

# --- 6. whole-step profile of llama3-8b, dummy weights, bf16 (rows are written as measured)
GPU_SLUG="$("$PY" -c 'import torch; n = torch.cuda.get_device_name().lower().replace("nvidia", ""); print("-".join(n.split()))')"
PROFILE="$OUT/profile_llama3-8b_${GPU_SLUG:-gpu}.csv"
if [ "$HAVE_RICH" = 1 ]; then
    run_stage "profile llama3-8b" 330 "$PY" -m slopilot.cli profile --model llama3-8b --device cuda \
        --dtype bfloat16 --out "$PROFILE"
else
    echo "rich missing: cannot run slopilot profile"; FAILED+=("profile llama3-8b")
fi

stage "done in $((SECONDS - START))s"
ls -l "$OUT"
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "FAILED stages: ${FAILED[*]}"; exit 1
fi
echo "all stages passed"
