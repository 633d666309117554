"""Ours against real vLLM on the random Llamas of bench/bench_models.py (`engine_throughput.py --sizes`).

Workloads: W1 = 64 prompts x 100 tokens -> 32 output tokens, W2 = 256 x 100 -> 128, azure = 256
Azure-conversation requests scaled by 1/8. Each repeat runs, per size and dtype, ours on the chosen
workloads (one process per run) and vLLM on them (one process, one engine start), the two in
alternating order between repeats so a drift in the machine's load favours neither. Both engines
get max_num_seqs 256 and room for every request at full length in their KV cache.
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
    """One run of ours in this process: prints {"tok_s", "cpu_tok_s", "backend"} as JSON."""

    from engine import LLM, SamplingParams

    spec = json.loads(Path(spec_path).read_text())
    prompts, outs = spec["prompts"], spec["outputs"]
    llm = LLM(spec["model"], max_num_seqs=MAX_NUM_SEQS, dtype=spec["dtype"])
    llm.generate(warmup_prompts(spec["seed"]), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outs]
    t, c = time.perf_counter(), time.process_time()
    results = llm.generate(prompts, params)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    assert [len(r.token_ids) for r in results] == list(outs)
    print(json.dumps({"tok_s": sum(outs) / wall, "cpu_tok_s": sum(outs) / cpu,
                      "backend": llm.engine.runner.backend.name}), flush=True)


def run_ours(path: Path, prompts, outs, dtype: str, seed: int, threads: int | None) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"model": str(path), "dtype": dtype, "prompts": prompts, "outputs": outs, "seed": seed}, f)
    cmd = [sys.executable, str(ROOT / "bench" / "engine_throughput.py"), "--ours-once", f.name]
    if threads:
        cmd += ["--threads", str(threads)]
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, cwd=ROOT)
    finally:
        os.unlink(f.name)
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(sizes: list[str], dtypes: list[str], names: list[str], repeats: int, seed: int,
            json_path: str | None, threads: int | None) -> None:

    runs: dict[tuple[str, str, str, str], list[tuple[float, float, float]]] = {}

    def record(size, dtype, name, engine, r) -> None:
        load = os.getloadavg()[0]
        runs.setdefault((size, dtype, name, engine), []).append((r["tok_s"], r["cpu_tok_s"], load))
        print(f"  {size:5s} {dtype:9s} {name:6s} {engine:5s} {r['tok_s']:8.1f} tok/s "
              f"({r['cpu_tok_s']:7.1f} per CPU-s), load {load:.1f}", flush=True)

    for rep in range(repeats):
        for size in sizes:
            cfg = hf_config(size)
            path = model_dir(size)
            loads = workloads(names, seed, cfg["vocab_size"], cfg["max_position_embeddings"])
            for dtype in dtypes:
                def ours() -> None:
                    for name, (prompts, outs) in loads.items():
                        record(size, dtype, name, "ours", run_ours(path, prompts, outs, dtype, seed, threads))

                def vllm() -> None:
                    specs = [{"name": k, "prompts": p, "outputs": o, "max_num_seqs": MAX_NUM_SEQS}
                             for k, (p, o) in loads.items()]
                    got = run_vllm(str(path), specs, dtype, 1, seed=seed, kv_gib=kv_gib(size, dtype, loads))
                    for name, r in got["runs"].items():
                        record(size, dtype, name, "vllm",
                               {"tok_s": r["tok_s"][0], "cpu_tok_s": r["cpu_tok_s"][0]})

                for engine in ((ours, vllm) if rep % 2 == 0 else (vllm, ours)):
                    engine()
    print(f"\nmedian output tokens/s over {repeats} interleaved runs (per CPU-second in brackets), "
          f"load average at the runs' ends in brackets after the ratio")
    medians = []
    for size in sizes:
        for dtype in dtypes:
            for name in names:
                o, v = runs[size, dtype, name, "ours"], runs[size, dtype, name, "vllm"]
                ow, oc, vw, vc = (statistics.median(x[i] for x in xs) for xs, i in
                                  ((o, 0), (o, 1), (v, 0), (v, 1)))
                loads_seen = [x[2] for x in o + v]
                medians.append({"size": size, "dtype": dtype, "workload": name, "ours": ow, "vllm": vw,
                                "ratio": ow / vw, "ours_per_cpu_s": oc, "vllm_per_cpu_s": vc,
                                "load_min": min(loads_seen), "load_max": max(loads_seen)})
                print(f"  {size:5s} {dtype:9s} {name:6s} ours {ow:8.1f} [{oc:7.1f}]  "
                      f"vLLM {vw:8.1f} [{vc:7.1f}]  ours/vLLM {ow / vw:5.2f}x [{oc / vc:.2f}x]  "
                      f"load {min(loads_seen):.1f}-{max(loads_seen):.1f}")
    if json_path:
        rows = [{"size": s, "dtype": d, "workload": n, "engine": e, "tok_s": w, "per_cpu_s": c, "load": ld}
                for (s, d, n, e), xs in runs.items() for w, c, ld in xs]
        Path(json_path).write_text(json.dumps({"argv": sys.argv, "repeats": repeats, "medians": medians,
                                               "runs": rows}, indent=1))
