"""Output tokens/s of real vLLM (offline `vllm.LLM`) on requests given as token ids; run by
bench/engine_throughput.py with the vLLM environment's Python, never imported by our code.

    .venv-vllm/bin/python bench/vllm_throughput.py SPEC.json

SPEC.json: {"model": DIR, "dtype": "float32", "repeats": 1, "warmup": [[ids]], "llm": {extra LLM
keyword arguments}, "runs": [{"name": str, "prompts": [[ids]], "outputs": [n], "max_num_seqs": n,
"background": busy processes beside the timed run, optional}]}.
Runs sharing a max_num_seqs share one `vllm.LLM`, built once (in the runs' order). Prints one JSON
line: {"runs": {name: {"tok_s": [...], "cpu_tok_s": [...], "load": [...]}}, "max_num_batched_tokens":
{seqs: n}}. CPU time is this process's and its children's (vLLM's engine core and workers, not the
busy processes), user + system; the load average is read as each timed run ends.
The model directory needs no tokenizer: prompts are token ids and nothing is detokenized.
"""

import json
import os
import sys
import time

from engine_background import background, busy_cpu_seconds


def cpu_seconds(exclude: frozenset[int] = frozenset()) -> float:
    """User + system CPU of this process and all its live descendants but the pids in exclude."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        if p.pid in exclude:
            continue
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    def requests(prompts, outputs):
        return ([TokensPrompt(prompt_token_ids=p) for p in prompts],
                [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
                 for n in outputs])

    warmup = requests(spec["warmup"], [8] * len(spec["warmup"]))
    out, budgets = {}, {}
    for seqs in dict.fromkeys(r["max_num_seqs"] for r in spec["runs"]):
        llm = LLM(spec["model"], skip_tokenizer_init=True, dtype=spec["dtype"], max_num_seqs=seqs, seed=0,
                  **spec.get("llm", {}))
        budgets[seqs] = llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
        llm.generate(*warmup, use_tqdm=False)
        for run in (r for r in spec["runs"] if r["max_num_seqs"] == seqs):
            prompts, params = requests(run["prompts"], run["outputs"])
            for _ in range(spec["repeats"]):
                # every timed run starts from an empty prefix cache, as ours does (a process of its
                # own each run): runs repeat the same prompts, and a cached pass skips their prefill
                # (on the Azure mix, 35k prompt tokens against 7k output, that doubled vLLM's rate)
                if not llm.reset_prefix_cache():
                    raise SystemExit("vLLM could not reset its prefix cache before a timed run")
                with background(run.get("background", 0)) as busy:
                    skip = frozenset(b.pid for b in busy)
                    t, c, b = time.perf_counter(), cpu_seconds(skip), busy_cpu_seconds(busy)
                    results = llm.generate(prompts, params, use_tqdm=False)
                    elapsed, cpu = time.perf_counter() - t, cpu_seconds(skip) - c
                    kept = (busy_cpu_seconds(busy) - b) / elapsed
                    load = os.getloadavg()[0]
                got = [len(r.outputs[0].token_ids) for r in results]
                assert got == run["outputs"], "vLLM generated other lengths than asked"
                res = out.setdefault(run["name"], {"tok_s": [], "cpu_tok_s": [], "load": [],
                                                    "busy_cores": []})
                res["tok_s"].append(sum(got) / elapsed)
                res["cpu_tok_s"].append(sum(got) / cpu)
                res["load"].append(load)
                res["busy_cores"].append(kept)
        del llm
    print(json.dumps({"runs": out, "max_num_batched_tokens": budgets}), flush=True)


if __name__ == "__main__":  # vLLM starts worker processes that import this module again
    main()
