"""`slopilot profile`: measured engine-step latencies over a grid of step shapes, as a profile CSV."""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

HELP = "time whole engine steps (prefill, decode, mixed) and write a profile CSV + metadata JSON"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "from a profile to a simulated fleet: docs/guide.md (Plan capacity with the simulator)"
    parser.add_argument("--model", default="tiny", help="preset name or a model directory (default: tiny)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on cuda, float32 on cpu), "
                        "float32, float16 or bfloat16")
    parser.add_argument("--out", default="profile.csv",
                        help="CSV path; the metadata goes beside it (PROFILE.meta.json)")
    parser.add_argument("--quick", action="store_true", help="a small grid (tiny on CPU: seconds)")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="largest decode batch (default 256 on cuda, 64 on cpu; 16 with --quick)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--attention-backend", default="auto", help="auto, torch, triton or cuda")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per shape (default 5, 3 quick)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per shape before timing")
    parser.add_argument("--prefill-chunks", default=None, help="comma list overriding the grid's chunks")
    parser.add_argument("--cached-contexts", default=None, help="comma list of cached tokens under a chunk")
    parser.add_argument("--decode-contexts", default=None, help="comma list of decode KV lengths")
    parser.add_argument("--decode-batches", default=None, help="comma list of decode batch sizes")
    parser.add_argument("--device-name", default=None, help="value of the CSV's device column")
    parser.add_argument("--kv-budget-gb", type=float, default=None,
                        help="memory for the KV cache; shapes that need more are left out (default: from "
                        "free GPU memory on cuda, a quarter of RAM on cpu)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice); 1 is steadiest on a busy machine")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="grid steps timed by the wall clock (default) or by the thread's CPU time "
                        "(CPU, --threads 1: a step's cost without other processes' share of the core)")
    live = parser.add_argument_group("serving-run profile (--from-run)")
    live.add_argument("--from-run", action="store_true",
                      help="instead of the grid, time every step of a Poisson serving run through "
                      "LLM.generate (real arrival times); also measures the wake-up of an idle engine")
    live.add_argument("--requests", type=int, default=300, help="requests in the run (default 300)")
    live.add_argument("--rate", type=float, default=10.0, help="arrivals per second (default 10)")
    live.add_argument("--prompt-tokens", default="32-256",
                      help="uniform prompt lengths LO-HI (default 32-256)")
    live.add_argument("--output-tokens", default="8-64", help="uniform output lengths LO-HI (default 8-64)")
    live.add_argument("--max-num-batched-tokens", type=int, default=2048,
                      help="the engine's token budget a step (default 2048)")
    parser.add_argument("--note", default=None, help="free text for the metadata (e.g. machine conditions)")
    parser.add_argument("--seed", type=int, default=0)


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 0:
        raise ValueError(f"{flag}: {text!r} needs non-negative integers")
    return values


def _range(text: str, flag: str) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in text.split("-"))
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is not a range LO-HI of integers") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"{flag}: {text!r} needs 1 <= LO <= HI")
    return lo, hi


def device_slug(device: str) -> str:
    import torch

    if device != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name().lower().replace("nvidia", "").strip()
    return "-".join(name.split())


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parents[2])
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def metadata(runner, args, rows: int, started: float, load_before: tuple) -> dict:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = runner.device.type == "cuda"
    return {
        "device": torch.cuda.get_device_name() if cuda else _cpu_model(),
        "device_column": args.device_name,
        "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
        "python": platform.python_version(), "platform": platform.platform(),
        "model": args.model, "model_config": asdict(runner.config), "dtype": str(runner.dtype).split(".")[-1],
        "engine": {"attention_backend": runner.backend.name, "block_size": runner.block_size,
                   "num_kv_blocks": runner.num_kv_blocks, "max_num_seqs": args.max_num_seqs,
                   "repeats": args.repeats, "warmup": args.warmup, "quick": args.quick,
                   "timing": "CUDA events" if cuda else ("time.thread_time (CPU time)" if
                                                         getattr(args, "clock", "wall") == "cpu" else
                                                         "time.perf_counter"),
                   "statistic": "median"},
        "git_commit": _git_commit(),
        "conditions": {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                       "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg()),
                       "seconds": round(time.time() - started, 1)},
        "rows": rows,
        "argv": sys.argv,
        "note": args.note,
    }


def kv_budget_bytes(args, config, dtype) -> float:
    """KV memory: what the flag says, else free GPU memory less weights and headroom, else RAM / 4."""
    import torch

    from engine.profiler import weight_bytes

    if args.kv_budget_gb is not None:
        return args.kv_budget_gb * 2**30
    if args.device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return 0.9 * free - weight_bytes(config, dtype.itemsize) - 8 * 2**30  # 8 GiB for activations
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 4


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine import profiler as prof
    from engine.model import resolve_config
    from engine.model_runner import ModelRunner, resolve_dtype
    from simulator.latency.profile import metadata_path

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available to this torch")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    started, load_before = time.time(), os.getloadavg()
    if args.max_num_seqs is None:
        args.max_num_seqs = 16 if args.quick else (256 if args.device == "cuda" else 64)
    if args.clock == "cpu" and (args.device != "cpu" or args.threads != 1 or args.from_run):
        raise ValueError("--clock cpu: grid profiles on --device cpu with --threads 1 only (one thread's "
                         "CPU time is the step's; a serving run is timed by the wall clock)")
    if args.from_run:
        return run_live(args, started, load_before)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    if args.max_num_seqs < 1 or args.repeats < 1 or args.block_size < 1:
        raise ValueError("--max-num-seqs, --repeats and --block-size must be >= 1")
    config = resolve_config(args.model)
    grid = prof.default_grid(args.max_num_seqs, args.quick, config.max_position_embeddings)
    if args.prefill_chunks:
        grid = replace(grid, prefill_chunks=_ints(args.prefill_chunks, "--prefill-chunks"))
    if args.cached_contexts:
        grid = replace(grid, cached_contexts=_ints(args.cached_contexts, "--cached-contexts"))
    if args.decode_contexts:
        grid = replace(grid, decode_contexts=_ints(args.decode_contexts, "--decode-contexts"))
    if args.decode_batches:
        batches = _ints(args.decode_batches, "--decode-batches")
        if min(batches) < 1:
            raise ValueError(f"--decode-batches: {args.decode_batches!r} needs batch sizes >= 1")
        grid = replace(grid, decode_batches=batches)

    torch_dtype = resolve_dtype(args.dtype, torch.device(args.device))
    bs = args.block_size
    block_bytes = prof.kv_bytes_per_token(config, torch_dtype.itemsize) * bs
    max_blocks = int(kv_budget_bytes(args, config, torch_dtype) // block_bytes)
    shapes, left_out = prof.fit_memory(grid.shapes(config.max_position_embeddings), bs, max_blocks)
    if not shapes:
        raise ValueError(f"no step shape of the grid fits {args.model}'s {config.max_position_embeddings} "
                         f"positions and {max_blocks} KV blocks")
    blocks_needed = max(prof.kv_blocks(s, bs) for s in shapes)
    runner = ModelRunner(args.model, num_kv_blocks=blocks_needed + 1, block_size=bs, device=args.device,
                         dtype=torch_dtype, attention_backend=args.attention_backend, seed=args.seed)
    args.device_name = args.device_name or device_slug(args.device)
    dtype = str(runner.dtype).split(".")[-1]

    # warm-up: allocator, kernel compilation and caches, on a medium prefill and a decode batch
    import random

    pool = list(range(runner.num_kv_blocks))
    prof.zero_kv(runner)  # before the warm-up steps too: they read context never written
    for shape in sorted(shapes, key=lambda s: s.num_tokens)[len(shapes) // 2:][:2]:
        seqs, news = prof.build_step(shape, pool, bs, runner.config.vocab_size, random.Random(args.seed))
        prof.time_step(runner, seqs, news, repeats=1, warmup=2)

    columns = [TextColumn("[bold]profile {task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f, Progress(*columns) as bar:
        writer = csv.DictWriter(f, fieldnames=prof.CSV_COLUMNS)
        writer.writeheader()
        task = bar.add_task(f"{args.model} {args.device} {dtype}", total=len(shapes))

        def on_row(row: dict) -> None:  # rows land as measured: a run cut short keeps what it has
            writer.writerow(row)
            f.flush()
            bar.advance(task)

        rows = prof.profile_rows(runner, shapes, device_name=args.device_name, model_name=config.name,
                                 dtype=dtype, repeats=args.repeats, warmup=args.warmup, seed=args.seed,
                                 on_row=on_row, clock=args.clock)
    meta = metadata(runner, args, len(rows), started, load_before)
    meta["left_out_for_memory"] = [vars(s) for s in left_out]
    metadata_path(out).write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {len(rows)} rows to {out} (metadata: {metadata_path(out)})")
    return 0


def run_live(args: argparse.Namespace, started: float, load_before: tuple) -> int:
    """--from-run: a profile of the steps of a serving run (engine.live_profile)."""
    from engine.live_profile import LoadSpec, live_profile
    from engine.llm import LLM
    from engine.profiler import CSV_COLUMNS
    from simulator.latency.profile import metadata_path

    spec = LoadSpec(args.requests, args.rate, _range(args.prompt_tokens, "--prompt-tokens"),
                    _range(args.output_tokens, "--output-tokens"), args.seed)
    if args.max_num_batched_tokens < 1 or args.block_size < 1:
        raise ValueError("--max-num-batched-tokens and --block-size must be >= 1")
    llm = LLM(args.model, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              block_size=args.block_size, device=args.device, dtype=args.dtype,
              attention_backend=args.attention_backend, seed=args.seed)
    runner = llm.engine.runner
    args.device_name = args.device_name or device_slug(args.device)
    dtype = str(runner.dtype).split(".")[-1]
    print(f"serving {spec.requests} requests at {spec.rate:g}/s on {args.model} ({args.device}, {dtype})")
    prof = live_profile(llm, spec, device_name=args.device_name, model_name=runner.config.name, dtype=dtype,
                        progress=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(prof.rows)
    meta = metadata(runner, args, len(prof.rows), started, load_before)
    meta["engine"].update(max_num_batched_tokens=args.max_num_batched_tokens, repeats=1, warmup=0,
                          statistic="one row a step", timing="time.perf_counter around LLMEngine.step")
    meta["from_run"] = {"load": asdict(spec), "wakeup_ms": prof.wakeup_ms,
                        "idle_arrivals": prof.idle_arrivals}
    metadata_path(out).write_text(json.dumps(meta, indent=2) + "\n")
    wake = "n/a" if prof.wakeup_ms is None else f"{prof.wakeup_ms:.3f} ms"
    print(f"wrote {len(prof.rows)} step rows to {out} (metadata: {metadata_path(out)}); "
          f"idle wake-up {wake} (median of {prof.idle_arrivals} arrivals at an idle engine)")
    return 0
