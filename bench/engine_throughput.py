"""Output tokens/s of our engine against transformers' generate, same model, same requests, one run.

Requests follow the Azure LLM conversation trace's (prompt, output) mix, scaled down to the model's
context. transformers runs them as a user of `generate` would: static batches (left-padded) that
each run until their longest request is done; we run continuous batching. Prints tokens/s and
ratios; medians over --repeats runs.

    .venv/bin/python bench/engine_throughput.py [--requests 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import LLM, SamplingParams  # noqa: E402

MODEL = dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
             rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, initializer_range=0.05)


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


def run_ours(path: str, prompts, outs, max_num_seqs: int) -> float:
    llm = LLM(path, max_num_seqs=max_num_seqs, max_num_batched_tokens=2048, num_kv_blocks=max_num_seqs * 64)
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outs]
    llm.generate(prompts[:4], params[:4])  # warm-up
    t = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t
    assert [len(r.token_ids) for r in results] == list(outs)
    return sum(outs) / elapsed


def run_hf(model, prompts, outs, batch: int) -> float:
    t = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(prompts), batch):
            ps, os_ = prompts[i:i + batch], outs[i:i + batch]
            width = max(len(p) for p in ps)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in ps])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps])
            n = max(os_)  # the batch runs until its longest request is done
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=0)
    return sum(outs) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    hf = LlamaForCausalLM(LlamaConfig(**MODEL)).eval()
    mix = azure_mix(args.requests, MODEL["max_position_embeddings"], args.seed)
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(3, MODEL["vocab_size"]) for _ in range(p)] for p, _ in mix]
    outs = [o for _, o in mix]
    print(f"{len(mix)} requests: prompt mean {statistics.mean(p for p, _ in mix):.0f}, "
          f"output mean {statistics.mean(outs):.0f} (max {max(outs)}) tokens; "
          f"threads {torch.get_num_threads()}")
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        for r in range(args.repeats):
            for b in (16, 64):
                results.setdefault(f"hf_batch{b}", []).append(run_hf(hf, prompts, outs, b))
                results.setdefault(f"ours_seqs{b}", []).append(run_ours(d, prompts, outs, b))
            print(f"  run {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in results.items()))
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\nmedian output tokens/s")
    for k, v in med.items():
        print(f"  {k:12s} {v:8.1f}")
    for b in (16, 64):
        print(f"ratio ours/hf at {b}: {med[f'ours_seqs{b}'] / med[f'hf_batch{b}']:.2f}x")


if __name__ == "__main__":
    main()
