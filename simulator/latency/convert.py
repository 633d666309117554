"""Converters from public GPU measurements to profile-CSV rows.

- Splitwise (`perf_model.csv`): each measured run gives a prefill row (batch x prompt tokens in one
  step, `prompt_time`) and a decode row (`token_time`, the mean step time of the generation) whose
  context is the batch's mean KV length over the generation, batch * (prompt + output / 2).
- DistServe (fitted coefficients, not measurements): rows are the fitted formulas evaluated on a
  grid inside the profiled range: prefill ms = a + b*sum(t) + c*sum(t^2); decode ms =
  a + b*sum(context) + c*batch, with separate coefficients from `decoding_large_small_bs_threshold`.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from engine.core.profile_csv import PROFILE_COLUMNS

SPLITWISE_COLUMNS = [*PROFILE_COLUMNS, "prompt_tokens", "output_tokens", "source_row"]
DISTSERVE_COLUMNS = [*PROFILE_COLUMNS, "prompt_tokens", "seq_context"]
DTYPE = "fp16"  # both sources measured 16-bit weights

# DistServe grid: OPT's positions stop at 2048; batches as served by vLLM on one A100 node
DISTSERVE_PREFILL_BATCH = (1, 2, 4, 8, 16)
DISTSERVE_PREFILL_TOKENS = (32, 64, 128, 256, 512, 1024, 2048)
DISTSERVE_PREFILL_MAX_BATCH_TOKENS = 16384
DISTSERVE_DECODE_BATCH = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)
DISTSERVE_DECODE_CONTEXT = (64, 128, 256, 512, 1024, 2048)


def _match(value: str, wanted) -> bool:
    return wanted is None or str(value) == str(wanted)


def splitwise_rows(path: str | Path, device: str | None = None, model: str | None = None,
                   tp: int | None = None) -> list[dict]:
    path = Path(path)
    need = ("model", "hardware", "prompt_size", "batch_size", "token_size", "prompt_time", "token_time",
            "tensor_parallel")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in need if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: not a Splitwise perf_model.csv (missing {', '.join(missing)})")
        out = []
        for i, r in enumerate(reader, start=2):
            if not (_match(r["hardware"], device) and _match(r["model"], model)
                    and _match(r["tensor_parallel"], tp)):
                continue
            try:
                p, b, g = int(r["prompt_size"]), int(r["batch_size"]), int(r["token_size"])
                t_prompt, t_token = float(r["prompt_time"]), float(r["token_time"])
                tpn = int(r["tensor_parallel"])
            except ValueError as exc:
                raise ValueError(f"{path}: row {i}: {exc}") from None
            common = {"device": r["hardware"], "model": r["model"], "dtype": DTYPE, "tp": tpn,
                      "batch_size": b, "prompt_tokens": p, "output_tokens": g, "source_row": i}
            out.append({**common, "phase": "prefill", "num_tokens": b * p, "context_tokens": b * p,
                        "latency_ms": t_prompt})
            # decode step j (1..g-1) leaves p + j tokens per sequence: mean p + g/2
            out.append({**common, "phase": "decode", "num_tokens": b, "context_tokens": b * (p + g // 2),
                        "latency_ms": t_token})
    if not out:
        raise ValueError(f"{path}: no rows match device={device} model={model} tp={tp}")
    return out


def distserve_rows(path: str | Path, model: str | None = None, tp: int | None = None,
                   device: str = "a100-80gb") -> list[dict]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    out = []
    for full_name, per_tp in data.items():
        short = full_name.split("/")[-1]
        if model is not None and model not in (full_name, short):
            continue
        for tp_key, c in per_tp.items():
            if not _match(tp_key, tp):
                continue
            try:
                a, b1, c2 = c["prefill"]
                small, large = c["decoding_smallbs"], c["decoding_largebs"]
                threshold = int(c["decoding_large_small_bs_threshold"])
            except (KeyError, ValueError, TypeError) as exc:
                raise ValueError(f"{path}: {full_name} tp {tp_key}: bad coefficients ({exc})") from None
            common = {"device": device, "model": short, "dtype": DTYPE, "tp": int(tp_key)}
            for bs in DISTSERVE_PREFILL_BATCH:
                for t in DISTSERVE_PREFILL_TOKENS:
                    if bs * t > DISTSERVE_PREFILL_MAX_BATCH_TOKENS:
                        continue
                    ms = a + b1 * bs * t + c2 * bs * t * t
                    out.append({**common, "phase": "prefill", "batch_size": bs, "num_tokens": bs * t,
                                "context_tokens": bs * t, "latency_ms": ms, "prompt_tokens": t,
                                "seq_context": t})
            for bs in DISTSERVE_DECODE_BATCH:
                da, db, dc = small if bs < threshold else large
                for ctx in DISTSERVE_DECODE_CONTEXT:
                    ms = da + db * bs * ctx + dc * bs
                    out.append({**common, "phase": "decode", "batch_size": bs, "num_tokens": bs,
                                "context_tokens": bs * ctx, "latency_ms": ms, "prompt_tokens": "",
                                "seq_context": ctx})
    if not out:
        raise ValueError(f"{path}: no entries match model={model} tp={tp}")
    bad = [r for r in out if r["latency_ms"] <= 0]
    if bad:
        raise ValueError(f"{path}: coefficients give a non-positive time for {bad[0]}")
    return out
