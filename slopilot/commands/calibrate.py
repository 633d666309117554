"""`slopilot calibrate PROFILE.csv [-o MODEL.json]`: fit a latency model, report its held-out error.

The model goes to PROFILE.model.json unless -o says otherwise; a file that is not a latency model
(the profile's metadata, PROFILE.meta.json or the older PROFILE.json) is never overwritten.

`slopilot calibrate --from-server URL --out MODEL.json [--budget SECONDS]` fits the same model from
outside a running OpenAI-compatible server (vLLM, SGLang, ours): a designed probe load
(controlplane.calibrate_probe), its streamed token times turned into engine steps
(simulator.latency.probe_fit); the server's settings it could read are recorded in the model."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("fit a step-latency model to a profile CSV, or to a running server (--from-server); "
        "print held-out error per phase")
DEFAULT_BUDGET_S = 120.0
# what the probe assumes of a server whose settings it can neither read nor was told (vLLM's serving
# defaults, with the batch capped so a probe stays short); assumed values are not recorded in the model
SHAPE = ("prefill_tokens", "prefill_context", "decode_seqs", "decode_context", "prefill_seqs")
ASSUMED = {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "max_model_len": 4096}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = "how a calibrated model is used: docs/guide.md (Plan capacity with the simulator)"
    p.add_argument("profile", type=Path, nargs="?",
                   help="profile CSV (columns of DESIGN.md; extra columns allowed)")
    p.add_argument("-o", "--output", "--out", type=Path, default=None,
                   help="model JSON to write (default: PROFILE.model.json, beside the profile)")
    s = p.add_argument_group("black-box calibration of a running server")
    s.add_argument("--from-server", metavar="URL", help="probe this OpenAI-compatible server instead of "
                   "reading a profile, e.g. http://127.0.0.1:8000")
    s.add_argument("--metrics-url", metavar="URL", help="read the server's /metrics (its settings, the "
                   "cross-check) here, when --from-server is a gateway in front of it (default: URL)")
    s.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS",
                   help=f"time the probe load may take (default {DEFAULT_BUDGET_S:g})")
    s.add_argument("--max-num-seqs", type=int, help="the server's setting, when its /metrics does not "
                   f"show it (the probe then assumes {ASSUMED['max_num_seqs']} and records nothing)")
    s.add_argument("--max-num-batched-tokens", type=int, help="the server's chunked-prefill token budget "
                   f"(assumed {ASSUMED['max_num_batched_tokens']} when not given)")
    s.add_argument("--max-model-len", type=int, help="default: what /v1/models lists")
    s.add_argument("--device", default="server", help="device name for the model (default: server)")
    s.add_argument("--dtype", default="unknown")
    s.add_argument("--tp", type=int, default=1)
    p.add_argument("--select", metavar="EXPR", help='use only the rows matching EXPR, e.g. "tp == 4" '
                   "(needed when the CSV holds several device/model/dtype/tp groups)")
    p.add_argument("--holdout-where", metavar="EXPR",
                   help='hold out the rows matching EXPR, e.g. "batch_size > 16 or num_tokens > 2048"')
    p.add_argument("--holdout-frac", type=float, default=0.2, help="random hold-out fraction (default 0.2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--refit-all", action="store_true",
                   help="after measuring the hold-out, refit on every row "
                   "(the provenance keeps the held-out error)")
    p.add_argument("--match-mean", action="store_true",
                   help="scale the fit so its total step time equals the profile's (for a profile of a "
                   "serving run, `slopilot profile --from-run`: a simulated run adds up mean steps)")
    p.add_argument("--plot", type=Path, help="residual plot PNG (default: MODEL.residuals.png)")
    p.add_argument("--no-plot", action="store_true")


def check_output(path: Path) -> None:
    """-o may replace a latency model, never another file (a profile's metadata holds measurements)."""
    import json

    from simulator.latency.model import FORMAT

    if not path.exists():
        return
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        data = None
    if not (isinstance(data, dict) and data.get("format") == FORMAT):
        metadata = isinstance(data, dict) and "engine" in data
        what = "a profile's metadata" if metadata else "not a latency model"
        raise ValueError(f"-o {path}: the file exists and is {what}; it is kept (give another -o, e.g. "
                         f"{path.with_suffix('.model.json')})")


def run(args: argparse.Namespace) -> int:
    if args.from_server:
        if args.profile is not None:
            raise ValueError("give either a profile CSV or --from-server, not both")
        if args.output is None:
            raise ValueError("--from-server needs --out MODEL.json")
        return run_from_server(args)
    if args.profile is None:
        raise ValueError("give a profile CSV, or --from-server URL")
    from simulator.latency.fit import calibrate, format_errors
    from simulator.latency.profile import read_profile
    from simulator.latency.where import evaluate_where

    args.output = args.output or args.profile.with_suffix(".model.json")
    check_output(args.output)
    prof = read_profile(args.profile)
    if args.select:
        prof = prof.subset(evaluate_where(args.select, prof))
        if len(prof) == 0:
            raise ValueError(f"--select {args.select!r} matches no row of {args.profile}")
    model, heldout, mask = calibrate(prof, args.holdout_where, args.holdout_frac, args.seed, args.refit_all,
                                     args.match_mean)
    if args.select:
        model.provenance["select"] = args.select
    model.save(args.output)
    split = f"rows matching {args.holdout_where!r}" if args.holdout_where else \
        f"random {args.holdout_frac:.0%} (seed {args.seed})"
    print(f"{model}: {int((~mask).sum())} training rows, {int(mask.sum())} held out ({split})")
    if "decode_law" in model.provenance:
        print(f"decode tokens priced by: {model.provenance['decode_law']} (chosen by extrapolating inside "
              "the training rows)")
    if heldout:
        print("held-out error:")
        print(format_errors(heldout))
    else:
        print("no rows held out: no held-out error")
    print(f"wrote {args.output}")
    if not args.no_plot:
        from simulator.latency.fit import fit
        from simulator.latency.plot import residual_plot

        plot = args.plot or args.output.with_suffix(".residuals.png")
        # the fit the hold-out measured
        shown = fit(prof.subset(~mask), args.match_mean) if args.refit_all else model
        residual_plot(plot, shown, prof, mask)
        print(f"wrote {plot}")
    return 0


def server_settings(args: argparse.Namespace, info: dict, listed_len: int | None) -> tuple[dict, dict]:
    """(settings known from the server's /metrics or the flags, settings the probe uses)."""
    known = {}
    if info.get("block_size", "None") not in ("", "None"):
        known["block_size"] = int(info["block_size"])
    if info.get("num_gpu_blocks", "None") not in ("", "None"):
        known["num_kv_blocks"] = int(info["num_gpu_blocks"])
    if "enable_prefix_caching" in info:
        known["enable_prefix_caching"] = info["enable_prefix_caching"] == "True"
    for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        value = getattr(args, key)
        if value is not None:
            if value < 1:
                raise ValueError(f"--{key.replace('_', '-')} must be >= 1")
            known[key] = value
    if "max_model_len" not in known and listed_len:
        known["max_model_len"] = int(listed_len)
    used = {**ASSUMED, **known}
    if "num_kv_blocks" in known and "block_size" in known:
        used["kv_tokens"] = known["num_kv_blocks"] * known["block_size"]
    return known, used


def run_from_server(args: argparse.Namespace) -> int:
    import httpx
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from controlplane.calibrate_probe import probe, read_metrics, server_model
    from simulator.latency.fit import format_errors
    from simulator.latency.probe_fit import fit_probes

    check_output(args.output)
    if args.budget <= 0:
        raise ValueError("--budget must be > 0 seconds")
    url = args.from_server.rstrip("/")
    metrics = (args.metrics_url or url).rstrip("/")
    with httpx.Client(timeout=30) as client:
        try:
            name, listed_len = server_model(client, url)
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"--from-server {url}: no model listed at /v1/models ({exc})") from None
        before = read_metrics(client, metrics)
    if args.metrics_url and not before:
        raise ValueError(f"--metrics-url {metrics}: no /metrics page answered there")
    known, used = server_settings(args, before.get("info", {}), listed_len)
    print(f"probing {name} at {url} for up to {args.budget:g} s; settings "
          + ", ".join(f"{k}={v}" + ("" if k in known else " (assumed)") for k, v in used.items()
                      if k != "kv_tokens"))
    columns = (TextColumn("[bold]probe[/]"), BarColumn(),
               TextColumn("{task.completed:.0f}/{task.total:.0f} s"), TextColumn("{task.fields[what]}"),
               TimeElapsedColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("probe", total=args.budget, what="")

        def on_probe(done: int, spec, elapsed: float) -> None:
            what = f"{done} probes, last: {spec.kind} batch {spec.batch} prompt {spec.prompt}"
            bar.update(task, completed=min(elapsed, args.budget), what=what)

        probes = probe(url, name, used, args.budget, args.seed, on_probe)
    with httpx.Client(timeout=30) as client:
        after = read_metrics(client, metrics)
    result = fit_probes(probes, (args.device, name, args.dtype, args.tp), args.holdout_frac, args.seed,
                        source=url)
    model = result.model
    model.engine_settings = known
    model.provenance["probe"] = {"url": url, "metrics_url": metrics, "budget_s": args.budget,
                                 "probes": len(probes), "step_rows": len(result.rows),
                                 # (prefill_tokens, prefill_context, decode_seqs, decode_context,
                                 # prefill_seqs) of each measured step: the probe range
                                 "shapes": [[r[k] for k in SHAPE] for r in result.rows],
                                 "cross_check": cross_check(probes, before, after)}
    model.save(args.output)
    print(f"{model}: {len(result.rows)} step rows from {len(probes)} probes; front end "
          f"{result.frontend_ms:.2f} ms + {1000 * result.frontend_ms_per_token:.2f} us a prompt token "
          "(idle TTFT less the prefill step)")
    q = model.provenance.get("frontend_ms_quantiles")
    if q:
        print(f"  front end p10 / p50 / p90 / p99: {q[10]:.2f} / {q[50]:.2f} / {q[90]:.2f} / {q[99]:.2f} ms "
              "(a pool with frontend_from_model draws each request's from these)")
    for line in model.provenance["probe"]["cross_check"]:
        print("  /metrics: " + line)
    print(f"held-out error (random {args.holdout_frac:.0%}):")
    print(format_errors(result.heldout))
    print(f"wrote {args.output}")
    return 0


def cross_check(probes: list, before: dict, after: dict) -> list[str]:
    """What the server counted during the probe beside what the client saw."""
    if not before or not after:
        return ["no /metrics page: nothing to cross-check"]
    streams = [s for p in probes for s in [*p.streams, *p.newcomers]]

    def delta(name: str) -> float | None:
        return after[name] - before[name] if name in after and name in before else None

    out = []
    sent_prompt = sum(s.prompt_tokens for s in streams)
    got = sum(sum(s.counts) for s in streams)
    for name, client_side in (("vllm:prompt_tokens_total", sent_prompt),
                              ("vllm:generation_tokens_total", got)):
        d = delta(name)
        if d is not None:
            out.append(f"{name} +{d:.0f} (client: {client_side})")
    hits = delta("vllm:prefix_cache_hits_total")
    if hits is not None:
        out.append(f"prefix cache hits +{hits:.0f} tokens (random prompts: expected about 0)")
    q_sum, q_n = delta("vllm:request_queue_time_seconds_sum"), delta("vllm:request_queue_time_seconds_count")
    if q_sum is not None and q_n:
        out.append(f"mean queue time {1000 * q_sum / q_n:.2f} ms over {q_n:.0f} requests")
    it_sum, it_n = delta("vllm:iteration_tokens_total_sum"), delta("vllm:iteration_tokens_total_count")
    if it_sum is not None and it_n:
        out.append(f"{it_n:.0f} engine steps of {it_sum / it_n:.1f} tokens on average")
    pre = delta("vllm:num_preemptions_total")
    if pre:
        out.append(f"{pre:.0f} preemptions (the probe's batches did not fit the KV cache)")
    return out
