"""csrc/paged_attention.cu must keep compiling for Hopper (sm_90) even where no GPU is present."""

import ctypes
import shutil
import subprocess
import sysconfig

import pytest
from torch.utils.cpp_extension import include_paths

from engine.attention import cuda_backend

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None,
                                reason="nvcc not on PATH: the CUDA kernel cannot be compiled here")


def test_paged_attention_compiles_for_sm90(tmp_path):
    obj = tmp_path / "paged_attention.o"
    includes = [f"-I{p}" for p in include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    cmd = ["nvcc", "-c", "-arch=sm_90", "-std=c++17", "-O3", *includes, str(cuda_backend.SOURCE),
           "-o", str(obj)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "warning" not in result.stderr.lower(), result.stderr[-4000:]
    symbols = subprocess.run(["nm", str(obj)], capture_output=True, text=True).stdout
    assert " T slopilot_paged_decode" in symbols and " T slopilot_partition_size" in symbols


def test_library_builds_and_loads_with_its_ctypes_signature(tmp_path):
    """The backend's own build path; the library loads without a GPU and rejects what it cannot run."""
    path = cuda_backend.build_library("90", out_dir=tmp_path)
    assert path.exists() and path.name == cuda_backend.library_name("90")
    assert cuda_backend.build_library("90", out_dir=tmp_path) == path  # cached by source hash
    lib = cuda_backend.load_library(path)
    assert lib.slopilot_partition_size() == 256
    null = ctypes.c_void_p(0)
    args = [null] * 8 + [0, 8, 2, 64, 16, 4, 1] + [0] * 7 + [1.0, 0, null]
    assert lib.slopilot_paged_decode(*args) == 0  # empty batch: nothing to launch
    args[8] = 3  # three sequences, but an unsupported head size, then an unsupported dtype
    args[11] = 96
    assert lib.slopilot_paged_decode(*args) == 1  # cudaErrorInvalidValue, before any launch
    args[11], args[23] = 64, 7
    assert lib.slopilot_paged_decode(*args) == 1
