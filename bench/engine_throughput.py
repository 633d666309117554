"""Output tokens/s of our engine against transformers' generate, same model, same requests, one run.

Requests follow the Azure LLM conversation trace's (prompt, output) mix, scaled down to the model's
context. transformers runs them as a user of `generate` would: static batches (left-padded) that
each run until their longest request is done; we run continuous batching. Prints tokens/s and
ratios; medians over --repeats runs. When the vLLM environment exists (`make vllm`), real vLLM runs
the same model directory and requests in the same run (offline `vllm.LLM` with the same
max_num_seqs and token budget, in its own environment as a subprocess: bench/vllm_throughput.py),
and ours / vLLM is printed too.

    .venv/bin/python bench/engine_throughput.py [--requests 256] [--repeats 3] [--no-vllm] [--no-hf]

With --backends torch,cpu it instead runs our engine alone on the three engine-speed workloads
(64 prompts x 100 tokens -> 32, 256 x 100 -> 128, 256 Azure-conversation requests / 8), once per
attention backend and dtype, interleaved, and prints tokens/s (wall and per CPU-second) and ratios.

With --vllm it runs ours (attention backend auto) and real vLLM (its defaults but max_num_seqs 256
and the dtype) on those three workloads, per --dtypes, interleaved, and prints medians and ours/vLLM:

    .venv/bin/python bench/engine_throughput.py --vllm --dtypes float32,bfloat16 --repeats 3 [--json F]

With --sizes (tiny, 80m, 400m: random Llamas of bench/bench_models.py) it runs ours and vLLM on
W1 (64 x 100 -> 32), W2 (256 x 100 -> 128) and the Azure mix, per size and dtype, each run in a
process of its own, the two engines' order alternating between repeats; it prints medians, ours/vLLM
and the load average of each run. --cells picks (size, workload) pairs instead; --background 0,2
runs each cell quiet and beside 2 busy processes (one per core, a second tenant, only during each
engine's timed run: bench/engine_background.py):

    .venv/bin/python bench/engine_throughput.py --sizes tiny,80m --workloads W1,W2 \
        --dtypes float32,bfloat16 --repeats 3 [--background 0,2] [--json F]
    .venv/bin/python bench/engine_throughput.py --cells 80m:W1,tiny:W2 --background 0,2 --json F

--table full|reduced is the whole ours-vs-vLLM table (bench/engine_table.sh runs it and renders the
page): full = every size x workload, both dtypes, quiet and 2 busy, medians of 3 (hours); reduced =
the same for 80m W1 and tiny W2 (the cells that fell behind under load).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
importlib.import_module("engine")  # before torch loads: importing engine sets OpenMP's wait policy

import torch  # noqa: E402
from engine_inputs import VLLM_PY, azure_mix, run_vllm, warmup_prompts  # noqa: E402

from engine import LLM, SamplingParams  # noqa: E402

MODEL = dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
             rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, initializer_range=0.05)


# --table: the cells of the must-show table (size:workload), all of them or the reduced set
TABLES = {"full": ",".join(f"{s}:{w}" for s in ("tiny", "80m", "400m") for w in ("W1", "W2", "azure")),
          "reduced": "80m:W1,tiny:W2"}
ALL_DTYPES = "float32,bfloat16"


def run_ours(path: str, prompts, outs, max_num_seqs: int, backend: str = "auto", dtype: str = "float32",
             kv_blocks_per_seq: int = 64) -> float:
    return run_ours_timed(path, prompts, outs, max_num_seqs, backend, dtype, kv_blocks_per_seq)[0]


def run_ours_timed(path: str, prompts, outs, max_num_seqs: int, backend: str, dtype: str,
                   kv_blocks_per_seq: int) -> tuple[float, float]:
    """Output tokens per wall second and per CPU second of this process (all its threads)."""
    llm = LLM(path, max_num_seqs=max_num_seqs, max_num_batched_tokens=2048,
              num_kv_blocks=max_num_seqs * kv_blocks_per_seq, attention_backend=backend, dtype=dtype)
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outs]
    llm.generate(prompts[:4], params[:4])  # warm-up
    t, c = time.perf_counter(), time.process_time()
    results = llm.generate(prompts, params)
    elapsed, cpu = time.perf_counter() - t, time.process_time() - c
    assert [len(r.token_ids) for r in results] == list(outs)
    return sum(outs) / elapsed, sum(outs) / cpu


def workloads(seed: int) -> dict[str, tuple[list[list[int]], list[int]]]:
    """The three engine-speed workloads: name -> (prompts as token ids, output lengths)."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, MODEL["vocab_size"]) for _ in range(n)]

    mix = azure_mix(256, MODEL["max_position_embeddings"], seed)
    return {
        "64x100 -> 32": ([ids(100) for _ in range(64)], [32] * 64),
        "256x100 -> 128": ([ids(100) for _ in range(256)], [128] * 256),
        "azure/8 x256": ([ids(p) for p, _ in mix], [o for _, o in mix]),
    }


def profile_decode(backends: list[str], dtype: str, steps: int, seed: int) -> None:
    """cProfile of `steps` decode steps of 256 sequences at ~100-token context, per backend."""
    import cProfile
    import io
    import pstats

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    prompts, _ = workloads(seed)["256x100 -> 128"]
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    with tempfile.TemporaryDirectory() as d:
        LlamaForCausalLM(LlamaConfig(**MODEL)).eval().save_pretrained(d)
        for backend in backends:
            llm = LLM(d, max_num_seqs=256, max_num_batched_tokens=2048, num_kv_blocks=256 * 16,
                      attention_backend=backend, dtype=dtype)
            engine = llm.engine
            for p in prompts:
                engine.add_request(p, params)
            while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.seqs.values()):
                engine.step()  # prefill until every sequence decodes
            prof = cProfile.Profile()
            t, c = time.perf_counter(), time.process_time()
            prof.enable()
            for _ in range(steps):
                engine.step()
            prof.disable()
            wall, cpu = (time.perf_counter() - t) / steps, (time.process_time() - c) / steps
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
            print(f"\n== {backend} {dtype}: decode step of 256 sequences: {wall * 1e3:.1f} ms wall, "
                  f"{cpu * 1e3:.1f} ms CPU (under cProfile), load {os.getloadavg()[0]:.1f}")
            print("\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip()))


def compare_backends(backends: list[str], dtypes: list[str], repeats: int, seed: int,
                     only: list[str] | None) -> None:
    """Our engine with each attention backend and dtype on the three workloads, runs interleaved."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    hf = LlamaForCausalLM(LlamaConfig(**MODEL)).eval()
    loads = workloads(seed)
    if only:
        loads = {k: v for k, v in loads.items() if any(o in k for o in only)}
    configs = [(b, d) for d in dtypes for b in backends]
    wall: dict[tuple[str, str, str], list[float]] = {}
    cpu: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        for r in range(repeats):
            for name, (prompts, outs) in loads.items():
                for backend, dtype in configs:
                    w, c = run_ours_timed(d, prompts, outs, 256, backend, dtype, 16)
                    wall.setdefault((name, backend, dtype), []).append(w)
                    cpu.setdefault((name, backend, dtype), []).append(c)
                    print(f"  run {r + 1} {name:15s} {backend:6s} {dtype:9s} {w:8.0f} tok/s "
                          f"({c:.0f} per CPU-s), load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\nmedian output tokens/s over {repeats} interleaved runs (per CPU-second in brackets); "
          f"threads {torch.get_num_threads()}")
    for name in loads:
        for dtype in dtypes:
            row = {b: (statistics.median(wall[name, b, dtype]), statistics.median(cpu[name, b, dtype]))
                   for b in backends}
            cells = "  ".join(f"{b} {w:7.0f} [{c:7.0f}]" for b, (w, c) in row.items())
            ratio = ""
            if len(backends) > 1:
                base = row[backends[0]]
                ratio = "  " + "  ".join(f"{b}/{backends[0]} {row[b][0] / base[0]:.2f}x "
                                         f"[{row[b][1] / base[1]:.2f}x]" for b in backends[1:])
            print(f"  {name:15s} {dtype:9s} {cells}{ratio}")


def ours_once(model_dir: str, prompts, outs, dtype: str, seed: int) -> tuple[float, float, str]:
    """Ours as a user would run it, LLM(max_num_seqs=256) with the dtype: output tokens per wall
    second and per CPU second of this process, and the attention backend auto picked."""
    llm = LLM(model_dir, max_num_seqs=256, dtype=dtype)
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outs]
    llm.generate(warmup_prompts(seed), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    t, c = time.perf_counter(), time.process_time()
    results = llm.generate(prompts, params)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    assert [len(r.token_ids) for r in results] == list(outs)
    return sum(outs) / wall, sum(outs) / cpu, llm.engine.runner.backend.name


def compare_vllm(dtypes: list[str], repeats: int, seed: int, only: list[str] | None, limit: int | None,
                 json_path: str | None) -> None:
    """Ours against vLLM (its defaults but max_num_seqs 256 and the dtype) on the three workloads:
    each repeat runs, per dtype, ours on all three then vLLM on all three (one vLLM start), or the
    other way round on odd repeats, so a drift in the machine's load favours neither."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    hf = LlamaForCausalLM(LlamaConfig(**MODEL)).eval()
    loads = {k: (p[:limit], o[:limit]) for k, (p, o) in workloads(seed).items()
             if not only or any(x in k for x in only)}
    runs: dict[tuple[str, str, str], list[tuple[float, float, float]]] = {}  # -> [(tok/s, per CPU-s, load)]
    info: dict[str, object] = {"ours torch threads": torch.get_num_threads()}

    def record(name: str, dtype: str, engine: str, wall: float, cpu: float) -> None:
        load = os.getloadavg()[0]
        runs.setdefault((name, dtype, engine), []).append((wall, cpu, load))
        print(f"  {name:15s} {dtype:9s} {engine:5s} {wall:7.0f} tok/s ({cpu:6.0f} per CPU-s), "
              f"load {load:.1f}", flush=True)

    def ours(dtype: str) -> None:
        for name, (prompts, outs) in loads.items():
            wall, cpu, info["ours attention backend"] = ours_once(d, prompts, outs, dtype, seed)
            record(name, dtype, "ours", wall, cpu)

    def vllm(dtype: str) -> None:
        specs = [{"name": k, "prompts": p, "outputs": o, "max_num_seqs": 256} for k, (p, o) in loads.items()]
        got = run_vllm(d, specs, dtype, 1, seed=seed)
        info["vLLM max_num_batched_tokens"] = got["max_num_batched_tokens"]["256"]
        for name, r in got["runs"].items():
            record(name, dtype, "vllm", r["tok_s"][0], r["cpu_tok_s"][0])

    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)  # both engines load this directory
        for r in range(repeats):
            for dtype in dtypes:
                for engine in ((ours, vllm) if r % 2 == 0 else (vllm, ours)):
                    engine(dtype)
    print(f"\nmedian output tokens/s over {repeats} interleaved runs (per CPU-second in brackets); "
          + ", ".join(f"{k} {v}" for k, v in info.items()))
    medians = []
    for name in loads:
        for dtype in dtypes:
            (ow, oc), (vw, vc) = [[statistics.median(x[i] for x in runs[name, dtype, e]) for i in (0, 1)]
                                  for e in ("ours", "vllm")]
            medians.append({"workload": name, "dtype": dtype, "requests": len(loads[name][1]),
                            "ours": ow, "vllm": vw, "ratio": ow / vw,
                            "ours_per_cpu_s": oc, "vllm_per_cpu_s": vc, "cpu_ratio": oc / vc})
            print(f"  {name:15s} {dtype:9s} ours {ow:7.0f} [{oc:6.0f}]  vLLM {vw:7.0f} [{vc:6.0f}]  "
                  f"ours/vLLM {ow / vw:.2f}x [{oc / vc:.2f}x]")
    if json_path:
        rows = [{"workload": n, "dtype": t, "engine": e, "tok_s": w, "per_cpu_s": c, "load": ld}
                for (n, t, e), xs in runs.items() for w, c, ld in xs]
        Path(json_path).write_text(json.dumps({"argv": sys.argv, "repeats": repeats, "info": info,
                                               "medians": medians, "runs": rows}, indent=1))


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
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM row even when .venv-vllm exists")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers (ours against vLLM only)")
    ap.add_argument("--backends", help="compare attention backends instead (e.g. torch,cpu) on the three "
                                       "engine workloads (64x100->32, 256x100->128, azure/8 x256)")
    ap.add_argument("--dtypes", default="float32", help="with --backends or --vllm: e.g. float32,bfloat16")
    ap.add_argument("--workloads", help="with --backends or --vllm: only workloads whose name contains one "
                                        "of these")
    ap.add_argument("--vllm", action="store_true", help="ours against vLLM on the three engine workloads "
                    "(max_num_seqs 256), per --dtypes, runs interleaved")
    ap.add_argument("--limit", type=int, help="with --vllm: only the first LIMIT requests of each workload")
    ap.add_argument("--json", help="with --vllm, --sizes, --cells or --table: write the runs and medians to "
                    "this file (with --sizes/--cells/--table: a results file bench/pages.py renders)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--sizes", help="ours against vLLM on random models of these sizes (tiny, 80m, 400m), "
                    "workloads W1, W2, azure (--workloads filters), per --dtypes, each run its own process")
    ap.add_argument("--cells", help="ours against vLLM on these SIZE:WORKLOAD pairs (e.g. 80m:W1,tiny:W2), "
                    "per --dtypes, like --sizes")
    ap.add_argument("--background", default="0", help="with --sizes/--cells: busy processes (one per core) "
                    "beside each timed run, a list to run each load in turn (e.g. 0,2); default 0")
    ap.add_argument("--table", choices=sorted(TABLES), help="the whole ours-vs-vLLM table (sets cells, "
                    "dtypes, --background 0,2 and --repeats 3)")
    ap.add_argument("--ours-once", metavar="SPEC", help=argparse.SUPPRESS)  # a child run of --sizes
    ap.add_argument("--profile-decode", type=int, metavar="STEPS",
                    help="with --backends: cProfile this many decode steps of 256 sequences per backend")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.ours_once or args.sizes or args.cells or args.table:
        import engine_sizes

        if args.ours_once:
            engine_sizes.ours_child(args.ours_once)
            return
        if not VLLM_PY.exists():
            sys.exit(f"--sizes needs {VLLM_PY} (`make vllm` builds it)")
        if args.table:
            args.cells, args.dtypes, args.background, args.repeats = TABLES[args.table], ALL_DTYPES, "0,2", 3
        try:
            busies = [int(b) for b in args.background.split(",")]
        except ValueError:
            sys.exit(f"--background: {args.background!r} is not a list of process counts (e.g. 0,2)")
        names = args.workloads.split(",") if args.workloads else ["W1", "W2", "azure"]
        cells = engine_sizes.parse_cells((args.sizes or "").split(","), names, args.cells)
        engine_sizes.compare(cells, args.dtypes.split(","), busies, args.repeats, args.seed, args.json,
                             args.threads)
        return
    if args.backends and args.profile_decode:
        profile_decode(args.backends.split(","), args.dtypes.split(",")[0], args.profile_decode, args.seed)
        return
    if args.vllm:
        if not VLLM_PY.exists():
            sys.exit(f"--vllm needs {VLLM_PY} (`make vllm` builds it)")
        compare_vllm(args.dtypes.split(","), args.repeats, args.seed,
                     args.workloads.split(",") if args.workloads else None, args.limit, args.json)
        return
    if args.backends:
        compare_backends(args.backends.split(","), args.dtypes.split(","), args.repeats, args.seed,
                         args.workloads.split(",") if args.workloads else None)
        return
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
                if not args.no_hf:
                    results.setdefault(f"hf_batch{b}", []).append(run_hf(hf, prompts, outs, b))
                results.setdefault(f"ours_seqs{b}", []).append(run_ours(d, prompts, outs, b))
            print(f"  run {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in results.items())
                  + f"; load {os.getloadavg()[0]:.1f}", flush=True)
        vllm = not args.no_vllm and VLLM_PY.exists()
        if vllm:
            runs = [{"name": f"vllm_seqs{b}", "prompts": prompts, "outputs": outs, "max_num_seqs": b}
                    for b in (16, 64)]
            llm_kwargs = {"max_num_batched_tokens": 2048, "max_model_len": MODEL["max_position_embeddings"]}
            got = run_vllm(d, runs, "float32", args.repeats, llm_kwargs, args.seed)
            results.update((name, r["tok_s"]) for name, r in got["runs"].items())
        elif not args.no_vllm:
            print(f"no {VLLM_PY} (`make vllm` builds it): no vLLM row")
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\nmedian output tokens/s")
    for k, v in med.items():
        print(f"  {k:12s} {v:8.1f}   runs: " + ", ".join(f"{x:.0f}" for x in results[k]))
    for b in (16, 64):
        if not args.no_hf:
            print(f"ratio ours/hf at {b}: {med[f'ours_seqs{b}'] / med[f'hf_batch{b}']:.2f}x")
        if vllm:
            print(f"ratio ours/vLLM at {b}: {med[f'ours_seqs{b}'] / med[f'vllm_seqs{b}']:.2f}x")


if __name__ == "__main__":
    main()
