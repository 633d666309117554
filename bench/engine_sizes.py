"""Ours against real vLLM on the random Llamas of bench/bench_models.py (`engine_throughput.py --sizes`).

Workloads: W1 = 64 prompts x 100 tokens -> 32 output tokens, W2 = 256 x 100 -> 128, azure = 256
Azure-conversation requests scaled by 1/8. A cell is (size, workload); each is run quiet and/or
beside a controlled background load (N busy processes, bench/engine_background.py, running only
during each engine's timed generate). Each repeat runs, per size and dtype, ours on the size's cells
(one process per run) and vLLM on them (one process, one engine start, every cell and load in it),
the two in alternating order between repeats so a drift in the machine's load favours neither.
Both engines get max_num_seqs 256 and room for every request at full length in their KV cache.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_models import hf_config, model_dir
from engine_background import background, busy_cpu_seconds
from engine_inputs import azure_mix, run_vllm, warmup_prompts

ROOT = Path(__file__).resolve().parent.parent
MAX_NUM_SEQS = 256


def workloads(names: list[str], seed: int, vocab: int, max_len: int) -> dict[str, tuple[list, list]]:

    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    out = {}
    for name in names:
        if name == "W1":
            out[name] = ([ids(100) for _ in range(64)], [32] * 64)
        elif name == "W2":
            out[name] = ([ids(100) for _ in range(256)], [128] * 256)
        elif name == "azure":
            mix = azure_mix(256, max_len, seed)
            out[name] = ([ids(p) for p, _ in mix], [o for _, o in mix])
        else:
            raise SystemExit(f"unknown workload {name!r}; valid: W1, W2, azure")
    return out


def kv_bytes_per_token(size: str, dtype: str) -> int:
    c = hf_config(size)
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * head_dim * (4 if dtype == "float32" else 2)


def kv_gib(size: str, dtype: str, loads: dict) -> int:
    """vLLM's KV space (whole GiB) for every request of the largest workload at full length, +20%."""
    tokens = max(sum(len(p) + o for p, o in zip(ps, os_)) for ps, os_ in loads.values())
    return max(1, math.ceil(1.2 * tokens * kv_bytes_per_token(size, dtype) / 2**30))


def ours_child(spec_path: str) -> None:
    """One run of ours in this process, beside spec["background"] busy processes during the timed
    generate: prints {"tok_s", "cpu_tok_s", "load", "backend", "threads"} as JSON."""
    import torch

    from engine import LLM, SamplingParams

    spec = json.loads(Path(spec_path).read_text())
    prompts, outs = spec["prompts"], spec["outputs"]
    llm = LLM(spec["model"], max_num_seqs=MAX_NUM_SEQS, dtype=spec["dtype"])
    llm.generate(warmup_prompts(spec["seed"]), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outs]
    with background(spec.get("background", 0)) as busy:
        t, c, b = time.perf_counter(), time.process_time(), busy_cpu_seconds(busy)  # c: not the busy ones
        results = llm.generate(prompts, params)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        kept = (busy_cpu_seconds(busy) - b) / wall
        load = os.getloadavg()[0]
    assert [len(r.token_ids) for r in results] == list(outs)
    print(json.dumps({"tok_s": sum(outs) / wall, "cpu_tok_s": sum(outs) / cpu, "load": load,
                      "busy_cores": kept, "backend": llm.engine.runner.backend.name,
                      "threads": torch.get_num_threads()}),
          flush=True)


def run_ours(path: Path, prompts, outs, dtype: str, seed: int, threads: int | None, busy: int = 0) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"model": str(path), "dtype": dtype, "prompts": prompts, "outputs": outs, "seed": seed,
                   "background": busy}, f)
    cmd = [sys.executable, str(ROOT / "bench" / "engine_throughput.py"), "--ours-once", f.name]
    if threads:
        cmd += ["--threads", str(threads)]
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, cwd=ROOT)
    finally:
        os.unlink(f.name)
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_cells(sizes: list[str], names: list[str], cells: str | None) -> list[tuple[str, str]]:
    """(size, workload) pairs: "tiny:W2,80m:W1" when cells is given, else every size x workload."""
    if not cells:
        return [(s, n) for s in sizes for n in names]
    out = []
    for cell in cells.split(","):
        size, sep, name = cell.partition(":")
        if not sep:
            raise SystemExit(f"--cells: {cell!r} is not SIZE:WORKLOAD (e.g. 80m:W1)")
        hf_config(size)  # raises on an unknown size
        out.append((size, name))
    return out


def label(busy: int) -> str:
    return "quiet" if busy == 0 else f"{busy} busy"


def compare(cells: list[tuple[str, str]], dtypes: list[str], busies: list[int], repeats: int, seed: int,
            json_path: str | None, threads: int | None) -> list[dict]:
    """Ours against vLLM on each cell, dtype and background load (busies: busy processes, 0 = none);
    returns the medians (and writes them, with every run, to json_path)."""
    # (tok/s, tok per CPU-s, load average at the run's end, cores the busy processes got meanwhile)
    Run = tuple[float, float, float, float]
    runs: dict[tuple[str, str, str, int, str], list[Run]] = {}
    started = time.time()

    def record(size, dtype, name, busy, engine, r) -> None:
        runs.setdefault((size, dtype, name, busy, engine), []).append((r["tok_s"], r["cpu_tok_s"], r["load"],
                                                                      r.get("busy_cores", 0.0)))
        print(f"  {size:5s} {dtype:9s} {name:6s} {label(busy):7s} {engine:5s} {r['tok_s']:8.1f} tok/s "
              f"({r['cpu_tok_s']:7.1f} per CPU-s), load {r['load']:.1f}, {time.time() - started:.0f} s",
              flush=True)

    sizes = list(dict.fromkeys(s for s, _ in cells))
    for rep in range(repeats):
        order = busies if rep % 2 == 0 else busies[::-1]
        for size in sizes:
            cfg = hf_config(size)
            path = model_dir(size)
            loads = workloads([n for s, n in cells if s == size], seed, cfg["vocab_size"],
                              cfg["max_position_embeddings"])
            for dtype in dtypes:
                def ours() -> None:
                    for name, (prompts, outs) in loads.items():
                        for busy in order:
                            record(size, dtype, name, busy, "ours",
                                   run_ours(path, prompts, outs, dtype, seed, threads, busy))

                def vllm() -> None:
                    specs = [{"name": f"{k}@{busy}", "prompts": p, "outputs": o, "max_num_seqs": MAX_NUM_SEQS,
                              "background": busy} for k, (p, o) in loads.items() for busy in order]
                    got = run_vllm(str(path), specs, dtype, 1, seed=seed, kv_gib=kv_gib(size, dtype, loads))
                    for key, r in got["runs"].items():
                        name, _, busy = key.rpartition("@")
                        record(size, dtype, name, int(busy), "vllm",
                               {"tok_s": r["tok_s"][0], "cpu_tok_s": r["cpu_tok_s"][0], "load": r["load"][0],
                                "busy_cores": r["busy_cores"][0]})

                for engine in ((ours, vllm) if rep % 2 == 0 else (vllm, ours)):
                    engine()
    print(f"\nmedian output tokens/s over {repeats} interleaved runs (per CPU-second in brackets), "
          f"the load average at the runs' ends after the ratio; {time.time() - started:.0f} s in all")
    medians = []
    for size, name in cells:
        for dtype in dtypes:
            for busy in busies:
                o, v = runs[size, dtype, name, busy, "ours"], runs[size, dtype, name, busy, "vllm"]
                ow, oc, ob, vw, vc, vb = (statistics.median(x[i] for x in xs) for xs, i in
                                          ((o, 0), (o, 1), (o, 3), (v, 0), (v, 1), (v, 3)))
                seen = [x[2] for x in o + v]
                medians.append({"size": size, "workload": name, "dtype": dtype, "background": busy,
                                "ours": ow, "vllm": vw, "ratio": ow / vw, "ours_per_cpu_s": oc,
                                "vllm_per_cpu_s": vc, "load_min": min(seen), "load_max": max(seen),
                                "ours_busy_cores": ob, "vllm_busy_cores": vb})
                print(f"  {size:5s} {dtype:9s} {name:6s} {label(busy):7s} ours {ow:8.1f} [{oc:7.1f}]  "
                      f"vLLM {vw:8.1f} [{vc:7.1f}]  ours/vLLM {ow / vw:5.2f}x [{oc / vc:.2f}x]  "
                      f"load {min(seen):.1f}-{max(seen):.1f}"
                      + (f"  busy processes got {ob:.2f} / {vb:.2f} cores" if busy else ""))
    if json_path:
        write_json(json_path, medians, runs, repeats, time.time() - started)
    return medians


def write_json(path: str, medians: list[dict], runs: dict, repeats: int, seconds: float) -> None:
    """The medians and every run, as the results file bench/pages.py renders on the page."""
    from pages import write_result

    def each(key: tuple, i: int) -> str:
        return ", ".join(f"{x[i]:.0f}" for x in runs[key])

    rows = []
    for m in medians:
        key = (m["size"], m["dtype"], m["workload"], m["background"])
        rows.append([m["size"], m["workload"], m["dtype"], label(m["background"]), round(m["ours"], 1),
                     round(m["vllm"], 1), f"{m['ratio']:.2f}x",
                     f"{m['ours_per_cpu_s'] / m['vllm_per_cpu_s']:.2f}x",
                     neighbour(m), f"{m['load_min']:.1f}-{m['load_max']:.1f}", each((*key, "ours"), 0),
                     each((*key, "vllm"), 0)])
    write_result(path, ["size", "workload", "dtype", "background", "ours tok/s", "vLLM tok/s", "ours ÷ vLLM",
                        "per CPU-second", "busy processes' cores, ours / vLLM", "load average", "ours runs",
                        "vLLM runs"], rows, [
        f"Output tokens/s, medians of {repeats} interleaved runs, each engine run its own process (vLLM "
        "0.32, CPU build, its defaults but max_num_seqs 256). \"2 busy\": two processes spinning, one "
        "pinned to each core, each in a session of its own, during each timed run. The load average is "
        "read at each run's end and includes them and whatever else ran. \"per CPU-second\": ours ÷ "
        f"vLLM in output tokens per CPU-second of each engine's processes. \"busy processes' cores\": the "
        "CPU the busy processes got during the timed run (medians, in cores): what the second tenant kept "
        f"beside each engine. {seconds / 60:.0f} minutes in all."])


def neighbour(m: dict) -> str:
    """The busy processes' cores beside ours and beside vLLM ("-" without busy processes, or in a
    results file from before this was measured)."""
    if not m["background"] or "ours_busy_cores" not in m:
        return "-"
    return f"{m['ours_busy_cores']:.2f} / {m['vllm_busy_cores']:.2f}"
