"""The engine's KV offload tier on the CPU engine: what a copy costs, and what the tier saves.

copy: ms per block and GB/s of the tier's store (device -> host pool) and load (host pool -> device)
for the tiny and small presets' block shapes, batches of 1/16/128 blocks, medians of interleaved
repetitions, beside one contiguous copy of the same bytes (the machine's memcpy rate).

multiturn: the first N requests of the Mooncake conversation trace on `tiny`, each 512-token hash
block of the trace standing for one 16-token block (its tokens drawn from the hash id; prompts cut
at 63 blocks, the tiny model's 1,024 positions), all queued at once under KV pressure (a small
device pool), with and without the tier: prefill tokens computed, hits by tier, wall time.

    .venv/bin/python bench/kv_offload.py copy [--reps 7]
    .venv/bin/python bench/kv_offload.py multiturn [--requests 1000] [--device-blocks 384] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import engine  # noqa: E402,F401  (sets OpenMP's passive wait policy before torch loads)

BLOCK = 16
MAX_BLOCKS = 63


def load_avg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# -- copy cost ----------------------------------------------------------------------------------

def copy_bench(reps: int) -> None:
    import torch

    from engine.kv_offload.copier import TensorCopier
    from engine.model import PRESETS

    pool, slots = 512, 512
    for name in ("tiny", "small"):
        c = PRESETS[name]
        shape = (pool, BLOCK, c.num_kv_heads, c.head_dim)
        kv = [(torch.randn(shape), torch.randn(shape)) for _ in range(c.num_layers)]
        copier = TensorCopier(kv, slots)
        for hk, hv in copier.host:  # touch the host pool once, as a tier in use would be
            hk.zero_()
            hv.zero_()
        block_bytes = TensorCopier.block_bytes(kv)
        for n in (1, 16, 128):
            rng = random.Random(n)
            times = {"store": [], "load": [], "memcpy": []}
            flat = torch.randn(n * block_bytes // 4)
            dst = torch.zeros_like(flat)  # touched: no first-write page faults in the baseline
            for _ in range(reps):  # interleaved: store, load, memcpy of the same bytes
                blocks, where = rng.sample(range(pool), n), rng.sample(range(slots), n)
                times["store"].append(copier.store(blocks, where))
                times["load"].append(copier.load(where, rng.sample(range(pool), n)))
                t = time.perf_counter()
                dst.copy_(flat)
                times["memcpy"].append(time.perf_counter() - t)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(json.dumps({"model": name, "block_bytes": block_bytes, "blocks": n,
                              **{f"{k}_ms_per_block": round(v * 1e3 / n, 4) for k, v in med.items()},
                              **{f"{k}_gbs": round(n * block_bytes / v / 1e9, 2) for k, v in med.items()},
                              "load_avg": load_avg()}), flush=True)


# -- prefill saved on a multi-turn trace ----------------------------------------------------------

def mooncake_prompts(path: Path, n: int) -> tuple[list[list[int]], list[int]]:
    prompts, outputs = [], []
    with open(path) as f:
        for line, _ in zip(f, range(n)):
            rec = json.loads(line)
            ids = []
            for h in rec["hash_ids"][:MAX_BLOCKS]:
                r = random.Random(h)
                ids += [r.randrange(258, 512) for _ in range(BLOCK)]
            ids.append(258 + len(prompts) % 254)  # a last token of its own: a prompt is never all cached
            prompts.append(ids)
            outputs.append(max(1, min(8, rec["output_length"] // 32)))
    return prompts, outputs


def run_trace(prompts, outputs, device_blocks: int, tier_gib: float | None) -> dict:
    from engine.args import EngineArgs
    from engine.core.sampling_params import SamplingParams
    from engine.llm_engine import LLMEngine

    eng = LLMEngine(EngineArgs(model="tiny", num_kv_blocks=device_blocks, max_num_seqs=8,
                               max_num_batched_tokens=2048, kv_offloading_size=tier_gib))
    eng.step_log = []
    t = time.perf_counter()
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        eng.add_request(p, SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True), str(i))
    while eng.has_unfinished():
        eng.step()
    wall = time.perf_counter() - t
    bm, tier = eng.block_manager, eng.block_manager.offload
    out = {"device_blocks": device_blocks, "tier_blocks": tier.num_slots if tier else 0,
           "prompt_tokens": sum(map(len, prompts)),
           "prefill_tokens_computed": sum(s.prefill_tokens for s, _ in eng.step_log),
           "device_hit_tokens": bm.prefix_cache_hits, "tier_hit_tokens": bm.offload_hits,
           "preemptions": eng.scheduler.num_preemptions, "wall_s": round(wall, 2)}
    if tier:
        out.update(tier_load_s=round(tier.load_seconds, 3), tier_store_s=round(tier.store_seconds, 3),
                   loaded_blocks=tier.loaded_blocks, stored_blocks=tier.stored_blocks)
    return out


def multiturn_bench(requests: int, device_blocks: int, reps: int, data: Path) -> None:
    prompts, outputs = mooncake_prompts(data / "traces" / "mooncake_conversation.jsonl", requests)
    block_gib = 2 * 2 * 2 * 16 * 4 * BLOCK / 2**30  # tiny, float32
    configs = [("no tier", device_blocks, None),
               ("tier 4x device", device_blocks, 4 * device_blocks * block_gib),
               ("tier 16x device", device_blocks, 16 * device_blocks * block_gib),
               ("tier 64x device", device_blocks, 64 * device_blocks * block_gib),
               ("unbounded device (bound)", 40_000, None)]
    walls: dict[str, list[float]] = {c[0]: [] for c in configs}
    for rep in range(reps):  # interleaved, so load from others lands on every config alike
        for label, blocks, gib in configs:
            r = run_trace(prompts, outputs, blocks, gib)
            walls[label].append(r["wall_s"])
            if rep == reps - 1:
                r["wall_s_median"] = round(statistics.median(walls[label]), 2)
                print(json.dumps({"config": label, **r, "load_avg": load_avg()}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("copy")
    c.add_argument("--reps", type=int, default=7)
    m = sub.add_parser("multiturn")
    m.add_argument("--requests", type=int, default=1000)
    m.add_argument("--device-blocks", type=int, default=384)
    m.add_argument("--reps", type=int, default=2)
    m.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    args = p.parse_args()
    if args.what == "copy":
        copy_bench(args.reps)
    else:
        if not (args.data / "traces").is_dir():
            sys.exit(f"public data not found at {args.data} (give --data)")
        multiturn_bench(args.requests, args.device_blocks, args.reps, args.data)


if __name__ == "__main__":
    main()
