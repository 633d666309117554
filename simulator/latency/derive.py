"""A latency model derived from a model architecture and a GPU sheet, with fitted efficiencies.

Each step is the sum of a matmul, an attention and a communication term, each its compute or memory
time (whichever is larger) over an efficiency (the achieved fraction of peak), plus overheads:

    matmul     roof(weights bytes / (HBM * e_mem), 2 * active params * tokens / (peak[dtype] * e_mm));
               MoE: compute on the top-k experts a token uses, bytes of the E (1 - (1 - k/E)^n)
               distinct experts n tokens are expected to touch
    attention  prefill: 4 * layers * heads * head_dim * sum t (ctx - t/2) / (peak[bf16] * e_attn)
               decode:  max(KV bytes read / (HBM * e_kv), its FLOPs / (peak[bf16] * e_attn))
    comm       2 all-reduces a layer (TP > 1): ring bytes / (link * e_comm), plus a latency each of
               o_allreduce + o_allreduce_hop * (tp - 1)
    overheads  o_step + o_layer * layers, o_prefill when the step prefills, o_seq per sequence,
               each scaled by A100's boost clock / the GPU's (small latency-bound kernels)

all per GPU at tensor-parallel degree tp (vLLM's sharding). These map one-to-one onto the
coefficients of the fitted latency model (simulator/latency/model.py), so a derived model is an
ordinary LatencyModel: the simulator, `serve --emulate` and the planner use it unchanged. The
efficiencies are fitted on every measured profile (simulator/latency/derive_fit.py) and shipped
in catalog/efficiency.json with their held-out errors.

Memory gives the KV capacity as vLLM computes it: gpu_memory_utilization of the GPU, less the
weights, the peak activations of a max_num_batched_tokens step and a fixed reserve (CUDA context,
NCCL, CUDA graphs); what is left, in blocks of block_size tokens, is the pool's KV blocks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from simulator.latency.arch import Arch
from simulator.latency.catalog import (
    BYTES,
    CATALOG_DIR,
    KV_DTYPES,
    WEIGHT_DTYPES,
    Gpu,
    check_dtype,
    get_arch,
    get_gpu,
)
from simulator.latency.model import LatencyModel

GIB = 1024**3
EFFICIENCIES = ("e_mm", "e_mem", "e_attn", "e_kv", "e_comm")
OVERHEADS = (
    "o_step_ms",
    "o_layer_ms",
    "o_allreduce_ms",
    "o_allreduce_hop_ms",
    "o_prefill_ms",
    "o_prefill_layer_ms",
    "o_seq_ms",
)
# gen_mm: achieved matmul FLOP/s grow as peak^(1 - gen_mm) across GPUs (0: a fixed fraction of every peak)
KNOBS = (*EFFICIENCIES, *OVERHEADS, "roof_p", "gen_mm")
PLAIN = {**dict.fromkeys(EFFICIENCIES, 1.0), **dict.fromkeys(OVERHEADS, 0.0), "roof_p": 8.0, "gen_mm": 0.0}
REF_PEAK = 312e12  # the bf16 peak gen_mm is relative to (A100's)
REF_CLOCK = 1410.0  # MHz: the overheads are fitted in A100 time (A100's boost clock)
EFFICIENCY_FILE = CATALOG_DIR / "efficiency.json"
# a derived model's name: CONFIG@GPU-tpN-DTYPE[-kvDTYPE], e.g. llama-3.1-70b@h200-tp4-fp8-kvfp8
NAME = re.compile(
    r"^(?P<config>[\w.\-]+)@(?P<gpu>[\w.\-]+?)-tp(?P<tp>\d+)-(?P<dtype>[a-z0-9]+)"
    r"(?:-kv(?P<kv>[a-z0-9]+))?$"
)


@dataclass(frozen=True)
class Memory:
    """One GPU's memory at the chosen TP, in bytes, and the KV blocks it leaves."""

    capacity: float
    usable: float  # capacity * gpu_memory_utilization
    weights: float
    activations: float
    reserve: float
    kv_bytes_per_token: float  # on one GPU
    block_size: int

    @property
    def kv_bytes(self) -> float:
        return self.usable - self.weights - self.activations - self.reserve

    @property
    def kv_blocks(self) -> int:
        return max(int(self.kv_bytes // (self.kv_bytes_per_token * self.block_size)), 0)

    def summary(self) -> dict:
        return {
            "gpu_memory_gib": self.capacity / GIB,
            "usable_gib": self.usable / GIB,
            "weights_gib": self.weights / GIB,
            "activations_gib": self.activations / GIB,
            "reserve_gib": self.reserve / GIB,
            "kv_cache_gib": self.kv_bytes / GIB,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token,
            "block_size": self.block_size,
            "num_kv_blocks": self.kv_blocks,
            "kv_tokens": self.kv_blocks * self.block_size,
        }


def memory(
    arch: Arch,
    gpu: Gpu,
    tp: int,
    dtype: str,
    kv_dtype: str,
    block_size: int = 16,
    utilization: float = 0.9,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 256,
    reserve_gib: float = 1.5,
) -> Memory:
    stored, _ = arch.linear_params(tp)
    weights = stored * BYTES[dtype] + arch.embedding_params(tp) * BYTES["bf16"]  # embeddings stay 16-bit
    # the profiling step's largest live tensors: hidden states, the MLP's widest output, q/k/v, and the
    # sampler's float32 logits for max_num_seqs sequences (vocabulary-parallel)
    width = (
        2 * arch.expert_ffn * max(arch.active_experts, 1)
        if arch.experts and arch.moe_layers
        else 2 * arch.ffn
    )
    qkv = (arch.heads + 2 * arch.kv_heads_per_gpu(tp) * tp) * arch.head_dim
    act = max_num_batched_tokens * (4 * arch.hidden + (width + qkv) / tp) * BYTES["bf16"]
    act += max_num_seqs * arch.vocab * 4
    return Memory(
        gpu.memory_gib * GIB,
        gpu.memory_gib * GIB * utilization,
        weights,
        act,
        reserve_gib * GIB,
        arch.kv_elems_per_token(tp) * BYTES[kv_dtype],
        block_size,
    )


def load_efficiencies() -> tuple[dict[str, float], dict]:
    """The shipped fitted efficiencies and their provenance (fit data, held-out errors)."""
    if not EFFICIENCY_FILE.is_file():
        raise ValueError(
            f"no fitted efficiencies at {EFFICIENCY_FILE.name}: run python -m simulator.latency.derive_fit "
            "--write"
        )
    d = json.loads(EFFICIENCY_FILE.read_text())
    return {k: float(d["efficiencies"][k]) for k in KNOBS}, d.get("provenance", {})


def step_params(arch: Arch, gpu: Gpu, tp: int, dtype: str, kv_dtype: str, eff: dict[str, float]) -> dict:
    """The LatencyModel coefficients (model.py's form) of this architecture on this GPU."""
    bw = gpu.hbm_gbs * 1e9
    stored, active = arch.linear_params(tp)
    head = arch.head_params(tp)
    peak_w, peak_16 = gpu.peak_flops(dtype), gpu.peak_flops("bf16")
    # MoE: the routed experts are read only as far as the step's tokens touch them (model.py's
    # moe_floor_ms term); the rest of the weights, shared experts and router included, every step
    routed = arch.routed_expert_params(tp) * BYTES[dtype]
    floor_bytes = stored * BYTES[dtype] - routed + head * BYTES["bf16"]
    e_mm = min(eff["e_mm"] * (peak_16 / REF_PEAK) ** -eff["gen_mm"], 1.0)
    # the fixed costs (kernel launches and small latency-bound kernels, all-reduce latency) are
    # fitted in A100 time and run at the GPU's SM clock: Splitwise's fixed decode cost of the same
    # model and TP is 1.2-1.5x larger on A100 than on H100, whose boost clock is 1.40x A100's
    eff = {**eff, **{k: eff[k] * REF_CLOCK / gpu.boost_mhz for k in OVERHEADS}}
    mm = lambda flops, peak: 1e3 * flops / (peak * e_mm)  # noqa: E731  (ms)
    token = mm(2 * active, peak_w)
    head_token = mm(2 * head, peak_16)  # the output head runs for each sampled token only
    kv_mem = 1e3 * arch.kv_elems_per_token(tp) * BYTES[kv_dtype] / (bw * eff["e_kv"])
    kv_flops = 1e3 * arch.decode_attn_flops_per_token(tp) / (peak_16 * eff["e_attn"])
    comm_token, allreduce = 0.0, 0.0
    if tp > 1:  # two all-reduces of the hidden state a layer; a ring sends 2 (tp-1)/tp of it
        ring = 2 * arch.layers * 2 * (tp - 1) / tp * arch.hidden * BYTES["bf16"]
        comm_token = 1e3 * ring / (gpu.link_gbs * 1e9 * eff["e_comm"])
        allreduce = 2 * arch.layers * (eff["o_allreduce_ms"] + eff["o_allreduce_hop_ms"] * (tp - 1))
    return {
        "overhead_ms": eff["o_step_ms"] + eff["o_layer_ms"] * arch.layers + allreduce,
        "prefill_fixed_ms": eff["o_prefill_ms"] + eff["o_prefill_layer_ms"] * arch.layers,
        "prefill_seq_ms": eff["o_seq_ms"] + head_token,
        "decode_seq_ms": eff["o_seq_ms"] + comm_token,
        "gemm_floor_ms": 1e3 * floor_bytes / (bw * eff["e_mem"]),
        "prefill_token_ms": token,
        "decode_token_ms": token + head_token,
        "prefill_attn_ms": 1e3 * arch.attn_flops_per_pair(tp) / (peak_16 * eff["e_attn"]),
        "decode_kv_ms": max(kv_mem, kv_flops),
        "roof_p": eff["roof_p"],
        "prefill_knots": [0.0] if comm_token else [],  # hinge at 0: comm_token per prefill token
        "prefill_hinge_ms": [comm_token] if comm_token else [],
        "decode_knots": [],
        "decode_hinge_ms": [],
        "decode_kv_ramp_ms": [],
        **(
            {
                "moe_floor_ms": 1e3 * routed / (bw * eff["e_mem"]),
                "moe_experts": float(arch.experts),
                "moe_topk": float(arch.active_experts),
            }
            if routed
            else {}
        ),
    }


def derive(
    config: str,
    gpu: str,
    tp: int,
    dtype: str = "bf16",
    kv_dtype: str | None = None,
    eff: dict[str, float] | None = None,
    provenance: dict | None = None,
    block_size: int = 16,
    utilization: float = 0.9,
) -> LatencyModel:
    """A LatencyModel for config (catalog name or config.json path) on tp GPUs; refused when it does
    not fit, with the numbers."""
    arch, sheet = get_arch(config), get_gpu(gpu)
    dtype = check_dtype(dtype, WEIGHT_DTYPES, "weight dtype")
    kv_dtype = check_dtype(
        kv_dtype or ("bf16" if dtype in ("fp8", "fp4") else dtype), KV_DTYPES, "KV-cache dtype"
    )
    tp = int(tp)
    if tp < 1 or arch.heads % tp:
        raise ValueError(f"{arch.name}: TP {tp} must divide its {arch.heads} attention heads")
    if eff is None:
        eff, fitted = load_efficiencies()
        provenance = {**fitted, **(provenance or {})}
    mem = memory(arch, sheet, tp, dtype, kv_dtype, block_size, utilization)
    if mem.kv_blocks < 1:
        s = mem.summary()
        raise ValueError(
            f"{arch.name} ({dtype}) does not fit on {tp} x {sheet.name} ({sheet.memory_gib:g} GiB each): "
            "per GPU "
            f"{s['weights_gib']:.1f} GiB of weights + {s['activations_gib']:.1f} GiB of activations + "
            f"{s['reserve_gib']:.1f} GiB reserved > {s['usable_gib']:.1f} GiB usable "
            f"({utilization:g} of {s['gpu_memory_gib']:.1f}); try a larger TP, a smaller dtype or a larger "
            "GPU"
        )
    params = step_params(arch, sheet, tp, dtype, kv_dtype, eff)
    notes = []
    if not sheet.native(dtype):
        notes.append(f"{sheet.name} has no {dtype} tensor cores: weight-only {dtype}, matmuls at bf16 peak")
    prov = {
        "derived": {
            "config": arch.name,
            "gpu": sheet.name,
            "tp": tp,
            "dtype": dtype,
            "kv_dtype": kv_dtype,
            "config_source": _source(config),
            "gpu_sources": sheet.sources,
            "notes": notes,
            "memory": mem.summary(),
            "efficiencies": {k: eff[k] for k in KNOBS},
            "form": "see simulator/latency/derive.py",
        },
        **(provenance or {}),
    }
    settings = {"num_kv_blocks": mem.kv_blocks, "block_size": block_size}
    model = LatencyModel(
        sheet.name, arch.name, dtype, tp, params, prov, fit_range={}, engine_settings=settings
    )
    return model


def _source(config: str) -> str:
    from simulator.latency.catalog import read_config

    cfg, _ = read_config(config)
    return str(cfg.get("_source", config))


def derived_name(config: str, gpu: str, tp: int, dtype: str = "bf16", kv_dtype: str | None = None) -> str:
    base = f"{config}@{gpu}-tp{int(tp)}-{dtype}"
    return base + (f"-kv{kv_dtype}" if kv_dtype else "")


def parse_derived_name(name: str) -> dict | None:
    """{config, gpu, tp, dtype, kv_dtype} of a derived model's name, or None if it is not one."""
    m = NAME.match(str(name))
    if not m:
        return None
    return {
        "config": m["config"],
        "gpu": m["gpu"],
        "tp": int(m["tp"]),
        "dtype": m["dtype"],
        "kv_dtype": m["kv"],
    }
