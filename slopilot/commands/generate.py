"""`slopilot generate`: generate text for a batch of prompts offline and print throughput."""

from __future__ import annotations

import argparse

HELP = "generate text for prompts with the paged-KV engine and print throughput"

DEFAULT_PROMPTS = [
    "The autoscaler saw the queue grow and",
    "A paged KV cache stores keys and values in",
    "Capacity planning for an LLM fleet starts with",
    "Continuous batching lets new requests join",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.args import EngineArgs, add_cli_args

    p.add_argument("prompts", nargs="*", help="prompts (default: a few built-in ones)")
    p.add_argument("--model", default=EngineArgs.model, help="preset name or a local model directory")
    p.add_argument("--num-prompts", type=int, default=64, help="repeat the prompts up to this many requests")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8)
    add_cli_args(p)


def run(args: argparse.Namespace) -> int:
    import time

    from engine import SamplingParams
    from engine.args import from_cli
    from engine.llm import LLM

    if args.num_prompts < 1 or args.max_tokens < 1:
        raise ValueError("--num-prompts and --max-tokens must be >= 1")
    base = args.prompts or DEFAULT_PROMPTS
    prompts = [base[i % len(base)] for i in range(args.num_prompts)]
    llm = LLM.from_engine_args(from_cli(args, model=args.model))
    params = [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed + i,
                             ignore_eos=True) for i in range(len(prompts))]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, progress=True)
    elapsed = time.perf_counter() - start
    for out in outputs[:len(base)]:
        print(f"{out.prompt!r} -> {out.text!r}")
    n_out = sum(len(o.token_ids) for o in outputs)
    n_in = sum(len(o.prompt_token_ids) for o in outputs)
    ttft = sorted(o.metrics.ttft for o in outputs)
    print(f"\n{len(outputs)} requests, {n_in} prompt + {n_out} generated tokens in {elapsed:.2f} s: "
          f"{n_out / elapsed:.1f} output tokens/s, {(n_in + n_out) / elapsed:.1f} total tokens/s, "
          f"median TTFT {ttft[len(ttft) // 2] * 1000:.0f} ms, "
          f"preemptions {llm.engine.scheduler.num_preemptions}")
    return 0
