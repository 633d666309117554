"""Output tokens/s of real vLLM (offline `vllm.LLM`) on requests given as token ids; run by
bench/engine_throughput.py with the vLLM environment's Python, never imported by our code.

    .venv-vllm/bin/python bench/vllm_throughput.py SPEC.json

SPEC.json: {"model": DIR, "prompts": [[ids]], "outputs": [n], "max_num_seqs": [16, 64], "repeats": 3,
"max_num_batched_tokens": 2048, "max_model_len": 1024}. Prints one JSON line: {"16": [tok/s, ...], ...}.
The model directory needs no tokenizer: prompts are token ids and nothing is detokenized.
"""

import json
import os
import sys
import time


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
              for n in spec["outputs"]]
    out = {}
    for seqs in spec["max_num_seqs"]:
        llm = LLM(spec["model"], skip_tokenizer_init=True, dtype="float32", max_num_seqs=seqs,
                  max_num_batched_tokens=spec["max_num_batched_tokens"], max_model_len=spec["max_model_len"],
                  seed=0)
        llm.generate(prompts[:4], params[:4], use_tqdm=False)  # warm-up
        for _ in range(spec["repeats"]):
            t = time.perf_counter()
            results = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - t
            got = [len(r.outputs[0].token_ids) for r in results]
            assert got == spec["outputs"], "vLLM generated other lengths than asked"
            out.setdefault(str(seqs), []).append(sum(got) / elapsed)
            load = os.getloadavg()[0]
            print(f"  vllm max_num_seqs {seqs}: {out[str(seqs)][-1]:.0f} tok/s, load {load:.1f}",
                  file=sys.stderr, flush=True)
        del llm
    print(json.dumps(out), flush=True)


if __name__ == "__main__":  # vLLM starts worker processes that import this module again
    main()
