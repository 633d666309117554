"""Engine settings in one place: LLMEngine, LLM, build_engine and the CLI all take an EngineArgs.

Each default is written here once; the CLI flags take theirs from the dataclass.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from engine.core.block_manager import cdiv
from engine.kv_offload import DEFAULT_BANDWIDTH_GBS, offload_error

# with no num_kv_blocks, the pool holds every running request at full length, up to this many tokens each
DEFAULT_KV_TOKENS_PER_SEQ = 2048


@dataclass
class EngineArgs:
    model: str = "tiny"  # preset name or a local model directory
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    num_kv_blocks: int | None = None  # None: kv_blocks() sizes the pool
    block_size: int = 16
    max_model_len: int | None = None  # None: the model's (or the runner's) limit
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True  # off: a prompt is computed whole in one step
    scheduling_policy: str = "fcfs"
    background_priority: int | None = None  # requests at or above it run only in steps with no others
    background_step_budget: float | None = None  # ms background work may add to a step with others
    background_solo_step: float | None = None  # ms cap of a step of background work only
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    attention_backend: str = "auto"
    kv_offloading_size: float | None = None  # GiB of host memory for evicted prefix blocks (vLLM's flag)
    kv_offloading_backend: str = "native"
    kv_offloading_bandwidth: float = DEFAULT_BANDWIDTH_GBS  # GB/s each way; the emulated engine's copies

    def __post_init__(self) -> None:
        positive = ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks", "max_model_len")
        for name in positive:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} (--{name.replace('_', '-')}) must be >= 1, got {value}")
        error = offload_error(self.kv_offloading_size, self.kv_offloading_backend, self.enable_prefix_caching)
        if error:
            raise ValueError(error)
        for name in ("background_step_budget", "background_solo_step"):
            value = getattr(self, name)
            if value is not None:
                flag = f"--{name.replace('_', '-')}"
                if self.background_priority is None:
                    raise ValueError(f"{flag} needs --background-priority (which requests are background)")
                if not 0 <= value < float("inf"):
                    raise ValueError(f"{flag} must be a non-negative number of milliseconds, got {value!r}")
        if not 0 < self.kv_offloading_bandwidth < float("inf"):
            raise ValueError(f"--kv-offloading-bandwidth must be a positive number of GB/s, got "
                             f"{self.kv_offloading_bandwidth!r}")

    def kv_blocks(self, max_model_len: int) -> int:
        """The KV pool size: num_kv_blocks, or room for every running request at full length (capped)."""
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        return self.max_num_seqs * cdiv(min(max_model_len, DEFAULT_KV_TOKENS_PER_SEQ), self.block_size)


def add_cli_args(p: argparse.ArgumentParser, real_only: str = "") -> None:
    """The engine's flags (all but --model), defaults from EngineArgs. real_only: a note for the
    flags an emulated engine ignores."""
    d = EngineArgs()
    g = p.add_argument_group("engine")
    g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="most requests in a batch")
    g.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                   help="most tokens computed in a step")
    g.add_argument("--num-kv-blocks", type=int, default=d.num_kv_blocks,
                   help="KV pool size (default: --max-num-seqs requests of up to "
                   f"{DEFAULT_KV_TOKENS_PER_SEQ} tokens)")
    g.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV block")
    g.add_argument("--max-model-len", type=int, default=d.max_model_len,
                   help="longest prompt + output (default: the model's limit)")
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="turn off prefix caching (on by default)")
    g.add_argument("--no-chunked-prefill", "--no-enable-chunked-prefill", dest="enable_chunked_prefill",
                   action="store_false", help="compute each prompt whole in one step (then "
                   "--max-num-batched-tokens must be at least the model length; by default prompts are "
                   "split across steps)")
    g.add_argument("--scheduling-policy", default=d.scheduling_policy, choices=["fcfs", "priority"],
                   help="order of the waiting queue: arrival, or the requests' priority field")
    g.add_argument("--background-priority", type=int, default=d.background_priority, metavar="P",
                   help="requests whose priority field is P or more (lower is served first) run only in "
                   "steps with no other request running or waiting; others preempt them for a seat or "
                   "KV blocks (e.g. batch lines sent with priority 1; default: none)")
    g.add_argument("--background-step-budget", type=float, default=d.background_step_budget, metavar="MS",
                   help="with --background-priority: background work may join a step that has other "
                   "work while the step's predicted time grows by at most MS milliseconds (needs a "
                   "step-time model: emulated engines; default: none joins)")
    g.add_argument("--background-solo-step", type=float, default=d.background_solo_step, metavar="MS",
                   help="with --background-priority: a step of background work only is filled up to MS "
                   "predicted milliseconds (at least one request), so a request arriving meanwhile "
                   "waits less (needs a step-time model: emulated engines; default: no cap)")
    g.add_argument("--seed", type=int, default=d.seed,
                   help="seeds the weights of a preset and the requests that bring no seed")
    note = f" ({real_only})" if real_only else ""
    g.add_argument("--device", default=d.device, help=f"torch device{note}")
    g.add_argument("--dtype", default=d.dtype, help=f"weights' and activations' dtype{note}")
    g.add_argument("--attention-backend", default=d.attention_backend,
                   help=f"paged attention kernel: auto picks the fastest built for the device{note}")
    g.add_argument("--kv-offloading-size", type=float, default=d.kv_offloading_size, metavar="GIB",
                   help="host memory (GiB) for a second KV tier: evicted prefix blocks are kept there "
                   "and copied back on a prefix hit (as vLLM's flag; off by default)")
    g.add_argument("--kv-offloading-backend", default=d.kv_offloading_backend,
                   help="offloading backend, as vLLM's flag: native (the only one here)")
    g.add_argument("--kv-offloading-bandwidth", type=float, default=d.kv_offloading_bandwidth,
                   metavar="GBS", help="host<->device copy bandwidth, GB/s each way, that an emulated "
                   "engine charges for offload-tier loads (default: PCIe Gen5 x16)")

def from_cli(args: argparse.Namespace, model: str | None = None) -> EngineArgs:
    """EngineArgs from the flags add_cli_args made (and --model, when the command has one)."""
    values = {f.name: getattr(args, f.name) for f in fields(EngineArgs)
              if f.name != "model" and hasattr(args, f.name)}
    if model is not None:
        values["model"] = model
    return EngineArgs(**values)
