"""The C++ CPU paged-attention kernel alone against the torch reference backend, per layer call.

CPU time (this process, all threads), best of --repeats, on the engine benchmark's shapes: decode of
256 sequences at ~165 tokens (8 query heads of 32 over 2 KV heads), 64 prefills of 100 tokens, and a
bigger-head decode (32 heads of 128 over 8 KV heads, 64 sequences at 500 tokens). Blocks are shuffled
across a larger pool, as after a while of serving.

    .venv/bin/python bench/cpu_attention_kernel.py --threads 1 --dtypes float32,bfloat16 [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.attention import build_metadata  # noqa: E402
from engine.attention.cpu_backend import CpuBackend  # noqa: E402
from engine.attention.torch_backend import TorchBackend  # noqa: E402

BLOCK = 16
# name -> (num_seqs, context lengths (low, high), query tokens per seq, heads, kv heads, head dim)
CASES = {
    "decode 256 x ~165, 8/2 heads of 32": (256, (130, 200), 1, 8, 2, 32),
    "prefill 64 x 100, 8/2 heads of 32": (64, (100, 100), 100, 8, 2, 32),
    "decode 64 x 500, 32/8 heads of 128": (64, (500, 500), 1, 32, 8, 128),
}


def make_case(num_seqs, lens, q_len, heads, kv_heads, head_dim, dtype, seed=0):
    rng = random.Random(seed)
    seq_lens = [rng.randint(*lens) for _ in range(num_seqs)]
    need = [-(-n // BLOCK) for n in seq_lens]
    pool = list(range(int(1.5 * sum(need)) + 1))
    rng.shuffle(pool)
    tables, used = [], 0
    for n in need:
        tables.append(pool[used:used + n])
        used += n
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(len(pool), BLOCK, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(len(pool), BLOCK, kv_heads, head_dim, generator=gen).to(dtype)
    q = torch.randn(num_seqs * q_len, heads, head_dim, generator=gen).to(dtype)
    return q, k, v, build_metadata(tables, seq_lens, [q_len] * num_seqs, BLOCK)


def cpu_ms(fn, repeats: int, budget_s: float = 0.3) -> float:
    """Best over repeats of the mean CPU time of a batch of calls (batch sized to ~budget_s)."""
    fn()
    c = time.process_time()
    fn()
    n = max(1, int(budget_s / max(time.process_time() - c, 1e-4)))
    best = float("inf")
    for _ in range(repeats):
        c = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - c) / n)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--no-torch", action="store_true", help="the C++ kernel only")
    ap.add_argument("--json", help="also write the results here (bench/pages.py renders them)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    backends = [CpuBackend()] + ([] if args.no_torch else [TorchBackend()])
    load0 = os.getloadavg()[0]
    print(f"threads {args.threads}, best of {args.repeats}, CPU ms per layer call, load {load0:.1f}")
    rows = []
    with torch.inference_mode():
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            for name, shape in CASES.items():
                q, k, v, meta = make_case(*shape, dtype)
                scale = shape[-1] ** -0.5
                out = torch.empty_like(q)
                calls = [lambda: backends[0].forward(q, k, v, meta, scale, out=out)]
                calls += [lambda b=b: b.forward(q, k, v, meta, scale) for b in backends[1:]]
                times = [cpu_ms(call, args.repeats) for call in calls]
                cells = "  ".join(f"{b.name} {t:7.2f}" for b, t in zip(backends, times))
                print(f"  {dtype_name:9s} {name:36s} {cells}", flush=True)
                rows.append([name, dtype_name, *(round(t, 2) for t in times)]
                            + ([f"x{times[1] / times[0]:.1f}"] if len(times) > 1 else []))
    if args.json:
        from bench.pages import write_result

        names = [f"{b.name} backend (ms)" for b in backends]
        write_result(args.json, ["case", "dtype", *names] + (["torch / cpu"] if len(backends) > 1 else []),
                     rows, notes=[f"CPU ms per layer call (this process, all threads), {args.threads} "
                                  f"torch thread(s), best of {args.repeats}; the C++ kernel (`cpu`) against "
                                  f"the torch reference backend; load average {load0:.1f} at the start."])


if __name__ == "__main__":
    main()
