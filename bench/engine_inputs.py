"""What the engine benchmarks share: the Azure length mix, warm-up prompts, and a real vLLM run in its
own environment on the same model directory (bench/engine_throughput.py and bench/engine_sizes.py)."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
VOCAB = 2048  # every bench model's vocabulary (the tiny preset's and the ~80M/~400M shapes')


def azure_mix(n: int, max_len: int, seed: int) -> list[tuple[int, int]]:
    """(prompt, output) lengths drawn from the Azure conversation trace, scaled to fit max_len."""
    trace = ROOT.parent / "shared" / "data" / "traces" / "azure_llm_2023_conv.csv"
    rng = random.Random(seed)
    if trace.exists():
        with open(trace) as f:
            rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]
        pairs = rng.sample(rows, n)
    else:  # lognormals with the trace's published means and medians (1155/1020, 211/129)
        import math

        def ln(mean, median):
            mu = math.log(median)
            return lambda: rng.lognormvariate(mu, math.sqrt(2 * (math.log(mean) - mu)))

        p, o = ln(1155, 1020), ln(211, 129)
        pairs = [(int(p()), int(o())) for _ in range(n)]
    scale = 8  # the trace's 8k-token context scaled to our 1k-token model
    return [(max(1, min(p // scale, max_len // 2)), max(1, min(o // scale, max_len // 2))) for p, o in pairs]


def run_vllm(model_dir: str, runs: list[dict], dtype: str, repeats: int, llm_kwargs: dict | None = None,
             seed: int = 0, kv_gib: int = 1) -> dict:
    """Real vLLM on the same model directory, in its own environment: runs are {"name", "prompts",
    "outputs", "max_num_seqs"}; returns bench/vllm_throughput.py's JSON (tok/s per run name).
    vLLM runs with its own OpenMP settings: the wait policy importing engine set here is dropped."""
    from engine import threads

    cache = ROOT / "build" / "vllm-cache"
    env = threads.child_env({k: v for k, v in os.environ.items()
                             if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")})
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CACHE_ROOT=str(cache / "vllm"),
               TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), VLLM_CPU_KVCACHE_SPACE=str(kv_gib),
               HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_LOGGING_LEVEL="WARNING")
    spec = {"model": model_dir, "dtype": dtype, "repeats": repeats, "runs": runs,
            "warmup": warmup_prompts(seed), "llm": llm_kwargs or {}}
    path = Path(model_dir) / "vllm-spec.json"
    path.write_text(json.dumps(spec))
    done = subprocess.run([str(VLLM_PY), str(ROOT / "bench" / "vllm_throughput.py"), str(path)], env=env,
                          cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def warmup_prompts(seed: int) -> list[list[int]]:
    """Four short prompts no workload shares a prefix with (so the warm-up fills no prefix cache)."""
    rng = random.Random(seed + 1000)
    return [[rng.randrange(3, VOCAB) for _ in range(24)] for _ in range(4)]
