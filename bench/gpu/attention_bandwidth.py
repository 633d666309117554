"""Decode-attention bandwidth on one GPU: KV bytes read over kernel time, Triton and CUDA backends.

The ceiling is a device-to-device copy measured in the same run (its bytes read + written over its time).
Shapes are llama3-8b's attention (32 query heads, 8 KV heads, head size 128) in bfloat16 with block
size 16 and shuffled block tables. Each point is the median of several CUDA-event-timed runs.

    python bench/gpu/attention_bandwidth.py --out out/attention_bandwidth.csv
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.attention import build_metadata, paged_attention_ref  # noqa: E402
from engine.attention.cuda_backend import CudaBackend  # noqa: E402
from engine.attention.triton_backend import TritonBackend  # noqa: E402


def time_ms(fn, repeats: int, warmup: int = 3) -> float:
    """Median of `repeats` CUDA-event timings of fn()."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_gbs(nbytes: int, repeats: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), repeats)
    return 2 * nbytes / ms / 1e6  # read + write


def make_inputs(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, block_size: int,
                dtype: torch.dtype, gen: torch.Generator):
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    perm = torch.randperm(num_blocks, generator=gen)  # shuffled physical blocks: a realistic paged cache
    tables = perm.view(batch, blocks_per_seq).tolist()
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    query = torch.randn(batch, heads, head_dim, device="cuda", dtype=dtype)
    meta = build_metadata(tables, [context] * batch, [1] * batch, block_size, device="cuda")
    return query, k_cache, v_cache, meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="1024,4096,16384")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="out/attention_bandwidth.csv")
    args = parser.parse_args(argv)
    heads, kv_heads, head_dim, block_size, dtype = 32, 8, 128, 16, torch.bfloat16
    scale = head_dim ** -0.5
    gen = torch.Generator().manual_seed(0)
    backends = {"triton": TritonBackend("cuda"), "cuda": CudaBackend("cuda")}

    copy_gbs = copy_bandwidth_gbs(2 << 30, args.repeats)
    print(f"device {torch.cuda.get_device_name()}  copy ceiling {copy_gbs:.0f} GB/s (read + write)")
    rows = []
    for context in [int(c) for c in args.contexts.split(",")]:
        for batch in [int(b) for b in args.batches.split(",")]:
            query, k_cache, v_cache, meta = make_inputs(batch, context, heads, kv_heads, head_dim, block_size,
                                                        dtype, gen)
            kv_bytes = 2 * batch * context * kv_heads * head_dim * k_cache.element_size()
            check = batch <= 8  # the torch reference loops per sequence: check the small batches only
            ref = paged_attention_ref(query, k_cache, v_cache, meta, scale) if check else None
            for name, backend in backends.items():
                def fn(backend=backend, q=query, k=k_cache, v=v_cache, m=meta):
                    return backend.forward(q, k, v, m, scale)
                err = float("nan")
                if ref is not None:
                    out = fn().float()
                    err = ((out - ref.float()).abs().max() / ref.float().abs().max()).item()
                    if not err < 1e-2:
                        raise SystemExit(f"{name} wrong at batch {batch} context {context}: rel err {err}")
                ms = time_ms(fn, args.repeats)
                gbs = kv_bytes / ms / 1e6
                rows.append(dict(backend=name, context=context, batch=batch, kv_bytes=kv_bytes,
                                 latency_ms=round(ms, 4), bandwidth_gbs=round(gbs, 1),
                                 fraction_of_copy=round(gbs / copy_gbs, 3), copy_gbs=round(copy_gbs, 1),
                                 rel_err=err))
                print(f"{name:6s} ctx {context:6d} batch {batch:4d}  {ms:8.3f} ms  {gbs:7.0f} GB/s "
                      f"({gbs / copy_gbs:5.1%} of copy)", flush=True)
            del query, k_cache, v_cache, meta
            torch.cuda.empty_cache()

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
