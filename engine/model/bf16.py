"""bfloat16 matmuls on CPUs without a bf16 matmul unit.

On x86 torch's bf16 matmul is fast only with AVX512-BF16 or AMX (oneDNN's native kernels). Without
them it is emulated: measured at [256 x 256] @ [256 x 688] with one thread, 6.8-7.9 ms on AVX2 and
2.7 ms on AVX-512 without BF16, against 0.59 ms in float32 and 0.11 ms with AMX. There a bf16 model
keeps its bf16 weights but each linear layer upcasts its input and weight to float32 per call,
multiplies in float32 and rounds the output to bf16: what a bf16 unit computes (bf16 inputs, float32
accumulation, bf16 result), at about float32 speed (0.70 ms; the weight's upcast is 0.02 ms).

The model's other bf16 ops (RMSNorm, RoPE, SiLU, the embedding) measured within 2x of float32 and
under 0.2 ms a call at 256 tokens on AVX2, so they stay in bf16; logits leave the model as float32.
"""

from __future__ import annotations

import functools
import os
import platform

import torch
import torch.nn.functional as F
from torch import nn

# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) at or above which its bf16 kernels are native
NATIVE_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10", "ALL")
MODES = ("auto", "native", "upcast")
# oneDNN's packed linear pads inputs of fewer rows than this (see packed_linear)
PAD_ROWS = 4


def cpu_flags() -> set[str]:
    """Feature flags of the first CPU in /proc/cpuinfo (x86 `flags`, Arm `Features`); empty elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


@functools.cache
def native_bf16_matmul() -> bool:
    """Whether torch's CPU bf16 matmul runs on bf16 hardware here (else it is emulated, and slow)."""
    isa = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    if not isa.startswith(NATIVE_ISAS):
        return False  # oneDNN told to stay below its bf16 kernels
    flags = cpu_flags()
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "bf16" in flags
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def upcast_wanted(mode: str, dtype: torch.dtype, device: torch.device) -> bool:
    """mode "auto": upcast bf16 matmuls on a CPU without native bf16; "native"/"upcast" force it."""
    if mode not in MODES:
        raise ValueError(f"bf16 matmul mode must be one of {MODES}, got {mode!r}")
    if dtype != torch.bfloat16 or device.type != "cpu" or mode == "native":
        return False
    return mode == "upcast" or not native_bf16_matmul()


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's linear on a packed weight, with inputs of 1-3 rows padded by zero rows to PAD_ROWS.

    Why: with the weights streaming from memory (a decode step over a whole model), oneDNN's kernels
    for 1-3 rows are slower than the one for 4. Measured on the 80M model's linears (AVX512-BF16,
    one thread, thread CPU time, median of 9): a step's 49 linears took 19.7 / 23.8 / 16.4 / 14.9 ms
    at 1 / 2 / 3 / 4 rows in float32 and 10.4 / 12.4 / 9.8 / 9.3 ms in bfloat16, so a decode step of
    2 sequences cost more than one of 4; padded, 1-3 rows take 15.7-16.1 ms (float32) and 9.7-10.1 ms
    (bf16). Rows of a matmul are independent, so the zero rows change no other row's result; 1-4
    rows now share one kernel."""
    rows = x.shape[0]
    if x.dim() == 2 and rows < PAD_ROWS:
        padded = F.pad(x, (0, 0, 0, PAD_ROWS - rows))
        return torch.ops.mkldnn._linear_pointwise(padded, packed, bias, "none", [], "")[:rows]
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class Linear(nn.Linear):
    """nn.Linear (same parameters, same names) that can compute a low-precision matmul in float32."""

    upcast = False
    packed: torch.Tensor | None = None  # the weight reordered for oneDNN (pack_linears), or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and not self.upcast:
            return packed_linear(x, self.packed, self.bias)
        if not self.upcast:
            return F.linear(x, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)


def set_upcast(model: nn.Module, enabled: bool) -> int:
    """Switch every Linear of the model to float32 compute (or back); returns how many."""
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    for m in layers:
        m.upcast = enabled
    return len(layers)


def packing_available(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether oneDNN's packed linear serves this dtype and device (CPU, float32 or bfloat16)."""
    return device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and \
        torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def pack_linears(model: nn.Module, enabled: bool = True, batch_hint: int = 32) -> int:
    """Reorders every Linear's weight once into oneDNN's blocked layout (a copy beside the weight),
    so that no call reorders it again; returns how many. Measured on the 80M model (AVX512-BF16, one
    thread, min of 4, machine loaded): bf16 forward 1.13-1.37x faster and bit-identical; float32
    decode batches 1.5x faster, its sums in another order (logits within 3e-5)."""
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    for m in layers:
        m.packed = None
        if enabled:
            with torch.no_grad():
                m.packed = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), batch_hint)
    return len(layers)
