"""Where a step of our engine spends its time: linear layers, attention (prefill and decode apart),
K/V writes, norms and RoPE, sampling, scheduling, metadata, and the rest (Python, embedding, residual
adds, activation), for one model size, dtype and batch.

Each part is timed by wrapping the engine's own functions with a clock (no profiler overhead), over
the prefill steps of BATCH prompts of PROMPT tokens and then DECODE decode-only steps; the rest is the
step's wall time minus the timed parts. --torch-profile also prints torch.profiler's top operators.

    .venv/bin/python bench/engine_profile.py --size 80m --dtype bfloat16 --batch 64 [--torch-profile]
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

importlib.import_module("engine")  # before torch loads: importing engine sets OpenMP's wait policy

import torch  # noqa: E402
from bench_models import model_dir  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402

PARTS = ("linear", "attention", "kv write", "norm+rope", "sampling", "scheduling", "metadata", "rest")


class Clock:
    def __init__(self) -> None:
        self.t: dict[str, float] = defaultdict(float)
        self.depth = 0  # a part called inside another is counted once, in the outer one

    def wrap(self, part: str, fn):
        def timed(*a, **k):
            if self.depth:
                return fn(*a, **k)
            self.depth += 1
            s = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.t[part] += time.perf_counter() - s
                self.depth -= 1
        return timed


def instrument(llm: LLM, clock: Clock) -> None:
    """Wraps the engine's parts with the clock (class attributes for the model's modules)."""
    import engine.model.llama as llama
    import engine.model_runner as runner_mod
    from engine.model import bf16

    engine = llm.engine
    runner = engine.runner
    linear_classes = {type(m) for m in runner.model.modules() if isinstance(m, torch.nn.Linear)}
    linear_classes |= {c for c in vars(bf16).values() if isinstance(c, type)
                       and issubclass(c, torch.nn.Module) and c.__module__ == bf16.__name__}
    for cls in linear_classes:
        if "forward" in vars(cls):
            cls.forward = clock.wrap("linear", vars(cls)["forward"])
    llama.RMSNorm.forward = clock.wrap("norm+rope", llama.RMSNorm.forward)
    llama.apply_rope = clock.wrap("norm+rope", llama.apply_rope)
    backend = runner.backend
    backend.forward = clock.wrap("attention", backend.forward)
    backend.write_kv = clock.wrap("kv write", backend.write_kv)
    runner_mod.sample = clock.wrap("sampling", runner_mod.sample)
    runner._prepare = clock.wrap("metadata", runner._prepare)
    engine.scheduler.schedule = clock.wrap("scheduling", engine.scheduler.schedule)


def split(clock: Clock, wall: float, steps: int) -> dict[str, float]:
    """ms per step of each part; "rest" is the wall time no part accounts for."""
    parts = {p: clock.t.get(p, 0.0) * 1e3 / steps for p in PARTS if p != "rest"}
    parts["rest"] = wall * 1e3 / steps - sum(parts.values())
    return parts


def run(size: str, dtype: str, batch: int, prompt: int, decode: int, threads: int | None,
        torch_profile: bool, seed: int = 0) -> dict[str, dict[str, float]]:
    if threads:
        torch.set_num_threads(threads)
    path = model_dir(size)
    llm = LLM(str(path), max_num_seqs=batch, max_num_batched_tokens=2048, dtype=dtype,
              num_kv_blocks=batch * ((prompt + decode + 40) // 16 + 2))
    engine = llm.engine
    rng = random.Random(seed)
    vocab = engine.runner.config.vocab_size
    warm = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate([[rng.randrange(3, vocab) for _ in range(24)] for _ in range(4)], warm)
    clock = Clock()
    instrument(llm, clock)
    params = SamplingParams(temperature=0, max_tokens=decode + 2, ignore_eos=True)
    for _ in range(batch):
        engine.add_request([rng.randrange(3, vocab) for _ in range(prompt)], params)
    out: dict[str, dict[str, float]] = {}
    s, steps = time.perf_counter(), 0
    while any(q.num_computed_tokens < q.num_prompt_tokens for q in engine.seqs.values()):
        engine.step()
        steps += 1
    out[f"prefill ({steps} steps)"] = split(clock, time.perf_counter() - s, steps)
    clock.t.clear()
    prof = None
    if torch_profile:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.__enter__()
    s = time.perf_counter()
    for _ in range(decode):
        engine.step()
    wall = time.perf_counter() - s
    if prof is not None:
        prof.__exit__(None, None, None)
    out[f"decode x{batch}"] = split(clock, wall, decode)
    if prof is not None:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return out


def print_table(title: str, rows: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}; ms per step, load {os.getloadavg()[0]:.1f}, threads {torch.get_num_threads()}")
    print(f"  {'phase':22s}" + "".join(f"{p:>11s}" for p in PARTS) + f"{'total':>10s}")
    for phase, parts in rows.items():
        print(f"  {phase:22s}" + "".join(f"{parts[p]:11.2f}" for p in PARTS) + f"{sum(parts.values()):10.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="80m", help="tiny, 80m or 400m (random weights)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=100)
    ap.add_argument("--decode", type=int, default=16, help="decode-only steps timed")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--torch-profile", action="store_true")
    a = ap.parse_args()
    rows = run(a.size, a.dtype, a.batch, a.prompt, a.decode, a.threads, a.torch_profile)
    print_table(f"{a.size} {a.dtype}, {a.batch} x {a.prompt}-token prompts", rows)


if __name__ == "__main__":
    main()
