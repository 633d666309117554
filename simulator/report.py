"""Results of a run: the per-request table and the summary (SLO attainment, goodput, cost).

simulator.output writes them (CSV, JSON, plots, HTML).
"""

from __future__ import annotations

import numpy as np

from autoscaler.slo import SloTarget
from simulator.cost import fleet_cost, pool_cost
from simulator.kvtier import tier_lines, tier_summary
from simulator.requests import OK, STATUS
from simulator.steptime import PS
from simulator.trigger_watch import unmatched_triggers


def request_table(fleet) -> dict[str, np.ndarray]:
    """Per-request columns in seconds (NaN where a time does not exist)."""
    n = len(fleet.wl)
    arrival = fleet.arrival_ps / PS
    log = fleet.requests

    def t(col):
        return np.where(col >= 0, col / PS, np.nan)

    first_sched, first_tok, finish = t(log.first_sched), t(log.first_token), t(log.finish)
    gen = log.generated
    ok = log.status == OK
    tpot = np.where(ok & (gen > 1), (finish - first_tok) / np.maximum(gen - 1, 1), np.nan)
    return {
        "id": np.arange(n),
        "arrival": arrival,
        "queue": first_sched - arrival,
        "first_token": first_tok,
        "finish": finish,
        "prompt_tokens": fleet.wl.prompt,
        "output_tokens": gen,
        "cached_tokens": log.cached,
        "ttft": first_tok - arrival,
        "tpot": tpot,
        "e2e": np.where(ok, finish - arrival, np.nan),
        "replica": log.replica,
        "pool": log.pool,
        "preemptions": log.preemptions,
        "retries": fleet.requests.retries,
        "status": log.status,
    }


def _pcts(x: np.ndarray) -> dict:
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return {"count": 0}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {
        "count": int(len(x)),
        "mean": float(x.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(x.max()),
    }


def slo_metric(req: dict, name: str) -> np.ndarray:
    return req["tpot"] if name in ("tpot", "itl") else req[name]


def slo_meets(req: dict, slo: SloTarget, arrived: np.ndarray) -> np.ndarray:
    """Per arrived request: did it meet this SLO (requests that did not finish never do)."""
    ok = req["status"][arrived] == 1
    v = slo_metric(req, slo.metric)[arrived]
    if slo.metric in ("tpot", "itl"):  # a one-token answer has no inter-token time: it meets the SLO
        return ok & (np.isnan(v) | (v <= slo.seconds))
    return ok & (v <= slo.seconds)


def window_attainment(req: dict, slos, arrived: np.ndarray, window: float = 60.0) -> float | None:
    """Fraction of windows (by arrival minute) where every SLO's percentile was within its threshold."""
    if not slos or not arrived.any():
        return None
    arr = req["arrival"][arrived]
    bins = (arr // window).astype(np.int64)
    good = total = 0
    for b in np.unique(bins):
        sel = np.flatnonzero(arrived)[bins == b]
        if len(sel) == 0:
            continue
        total += 1
        fine = True
        for slo in slos:
            v = slo_metric(req, slo.metric)[sel]
            v = np.where(req["status"][sel] == 1, v, 1e18)  # unfinished: worse than any SLO
            if slo.metric in ("tpot", "itl"):
                v = np.where(np.isnan(v), 0.0, v)
            if np.percentile(v, slo.percentile) > slo.seconds:
                fine = False
                break
        good += fine
    return good / total if total else None


def summarize(fleet) -> dict:
    sc = fleet.sc
    req = request_table(fleet)
    arrived = np.arange(len(req["id"])) < fleet.arrived  # arrivals are processed in order
    measured = arrived & (req["arrival"] >= sc.warmup)  # the SLOs' requests: after the warm-up
    n_measured = int(measured.sum())
    n_arrived = int(arrived.sum())
    status = req["status"]
    span = (fleet.end_ps if fleet.end_ps > 0 else fleet.end_time_ps) / PS
    ok = status == 1
    slos = {}
    joint = np.ones(n_measured, dtype=bool)
    for slo in sc.slos:
        meets = slo_meets(req, slo, measured)
        joint &= meets
        value = _pcts(slo_metric(req, slo.metric)[measured & ok]).get(f"p{int(slo.percentile)}")
        if value is None:
            vals = slo_metric(req, slo.metric)[measured & ok]
            vals = vals[~np.isnan(vals)]
            value = float(np.percentile(vals, slo.percentile)) if len(vals) else None
        slos[slo.metric] = {
            "threshold": slo.seconds,  # seconds
            "percentile": slo.percentile,
            "attainment": float(meets.mean()) if n_measured else None,
            "value_at_percentile": value,
            "met": bool(value is not None and value <= slo.seconds),
        }
    pools = {}
    for pool in fleet.pools:
        in_pool = req["pool"] == pool.index
        rs = pool.replica_seconds(fleet.end_time_ps)
        ready_s = pool.ready_seconds(fleet.end_time_ps)
        hits = sum(r.bm.prefix_cache_hits for r in pool.replicas)
        queries = sum(r.bm.prefix_cache_queries for r in pool.replicas)
        pools[pool.spec.name] = {
            "replica_hours": rs / 3600,
            "cost": rs / 3600 * pool.spec.cost_per_hour,
            "utilization": pool.busy_seconds() / ready_s if ready_s > 0 else None,
            "scale_events": len(pool.scale_events),
            "scale_event_list": [{"time": t, "from": a, "to": b} for t, a, b in pool.scale_events],
            "max_replicas": max([e[2] for e in pool.scale_events] + [pool.spec.replicas]),
            "replicas_created": len(pool.replicas),
            # vLLM's counters: every admission, recomputes after preemption included
            "prefix_cache_hit_rate": hits / queries if queries else None,
            # requests' own prompts at their first admission (what routing can win)
            "prompt_cache_hit_rate": _ratio(
                req["cached_tokens"][in_pool & ok], req["prompt_tokens"][in_pool & ok]
            ),
            "peak_kv_usage": max((r.max_usage for r in pool.replicas), default=0.0),
            "preemptions": int(sum(r.sched.num_preemptions for r in pool.replicas)),
            "kv_tiers": tier_summary(pool),  # hit rates by tier, prompt tokens computed (simulator.kvtier)
            **pool_cost(pool, fleet.end_ps, fleet.end_time_ps),
        }
    tl = fleet.timeline
    in_system = (
        float(
            np.mean(
                [
                    sum(r["waiting"] + r["running"] for r in tl if r["time"] == t)
                    for t in sorted({r["time"] for r in tl})
                ]
            )
        )
        if tl
        else None
    )
    e2e = req["e2e"][arrived & ok]
    summary = {
        "scenario": sc.name,
        "seed": fleet.seed,
        "duration": span,
        "simulated_until": fleet.end_time_ps / PS,
        "requests": {
            "arrived": n_arrived,
            "ok": int(ok.sum()),
            **{s: int((status[arrived] == i).sum()) for i, s in enumerate(STATUS) if i >= 2},
            "retries": int(fleet.requests.retries.sum()),
        },
        "slo": slos,
        "slo_attainment_joint": float(joint.mean()) if n_measured and sc.slos else None,
        "slo_window_attainment": window_attainment(req, sc.slos, measured),
        "warmup": sc.warmup,
        # triggers whose query never returned a sample: scaling on nothing (simulator.trigger_watch)
        "unmatched_triggers": unmatched_triggers(fleet),
        "goodput_rps": float(joint.sum()) / span if span > 0 and sc.slos else None,
        "throughput_rps": float(ok.sum()) / span if span > 0 else None,
        "output_tokens_per_s": float(req["output_tokens"][ok].sum()) / span if span > 0 else None,
        "latency": {k: _pcts(req[k][arrived & ok]) for k in ("ttft", "tpot", "e2e", "queue")},
        "pools": pools,
        **({"pd": fleet.pd.summary()} if getattr(fleet, "pd", None) is not None else {}),
        "replica_hours": sum(p["replica_hours"] for p in pools.values()),
        "cost": sum(p["cost"] for p in pools.values()),
        "costs": fleet_cost(fleet.pools, pools, fleet.end_ps, fleet.end_time_ps, sc.currency,
                            float(req["output_tokens"][ok].sum())),
        "scale_events": sum(p["scale_events"] for p in pools.values()),
        "littles_law": {
            "mean_in_system": in_system,
            # over the whole simulated span, as the timeline covers it
            "throughput_x_mean_e2e": float(ok.sum()) / (fleet.end_time_ps / PS) * float(e2e.mean())
            if len(e2e)
            else None,
        },
    }
    return summary


def _ratio(num: np.ndarray, den: np.ndarray) -> float | None:
    d = float(den.sum())
    return float(num.sum()) / d if d > 0 else None


def slos_missed(summary: dict) -> list[str]:
    """The SLOs the run missed (its percentile above the target, or nothing finished to measure)."""
    return [name for name, v in summary["slo"].items() if not v["met"]]


def _money(x: float | None, currency: str) -> str:
    return "n/a" if x is None else f"{x:,.2f} {currency}"


def summary_lines(s: dict) -> list[str]:
    """The summary as terminal lines: requests and the SLO verdict, latency, each SLO, cost."""
    nan = float("nan")
    r, c, cur = s["requests"], s["costs"], s["costs"]["currency"]
    failed = ", ".join(f"{r[k]} {k}" for k in STATUS[2:] if r.get(k))
    missed = slos_missed(s)
    if missed:
        head = (f"SLOs MISSED ({', '.join(missed)}): {r['arrived']} requests arrived, {r['ok']} finished"
                + (f" ({failed})" if failed else ""))
    elif s["slo"]:
        head = f"all SLOs met: {r['ok']}/{r['arrived']} requests ok" + (f" ({failed})" if failed else "")
    else:
        head = f"{r['ok']}/{r['arrived']} requests ok (no SLOs given)" + (f" ({failed})" if failed else "")
    lines = [f"warning: {w['message']}" for w in s.get("unmatched_triggers", [])] + [head]
    for k in ("ttft", "tpot", "e2e"):
        q = s["latency"][k]
        lines.append(f"{k.upper():5s} p50 {q.get('p50', nan):.3f} s  p90 {q.get('p90', nan):.3f} s  "
                     f"p99 {q.get('p99', nan):.3f} s")
    for name, v in s["slo"].items():
        at = v["value_at_percentile"]
        value = "nothing finished" if at is None else f"{at:.3f} s"
        within = "" if v["attainment"] is None else f", {100 * v['attainment']:.2f}% of requests within"
        lines.append(f"SLO {name} p{v['percentile']:g} <= {v['threshold']:g} s: {value} "
                     f"({'met' if v['met'] else 'MISSED'}){within}")
    rates = [f"throughput {s['throughput_rps'] or 0:.2f} req/s",
             f"{s['output_tokens_per_s'] or 0:.0f} output tokens/s"]
    if s["goodput_rps"] is not None:
        rates.insert(0, f"goodput {s['goodput_rps']:.2f} req/s (requests within every SLO)")
    lines.append(", ".join(rates))
    lines.append(f"cost {_money(c['total'], cur)}: {_money(c['during_workload'], cur)} while the workload "
                 f"ran, {_money(c['drain'], cur)} draining the {c['drain_seconds']:.0f} s after it; "
                 f"{_money(c['per_hour_at_peak'], cur)}/h at the peak")
    gpus = ", ".join(f"{p['gpus_per_replica']} a replica ({name})" for name, p in s["pools"].items())
    lines.append(f"GPUs: {gpus}; {s['replica_hours']:.2f} replica-hours, {c['gpu_hours']:.2f} GPU-hours; "
                 f"{_money(c['per_million_output_tokens'], cur)} per million output tokens; "
                 f"scale events: {s['scale_events']}")
    return lines + tier_lines(s)
