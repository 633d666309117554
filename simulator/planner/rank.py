"""From the plan's simulated answers to plan.json: costs, the ranking and the answer.

Costs per day: a static fleet is paid around the clock (replicas x GPUs x price x 24 h); an autoscaled
run's cost while the workload ran is scaled by `compress` (the simulated curve is that much shorter)
and then to 24 h (a curve of another length is taken as repeating). Options that meet every SLO rank
first, each group by cost per day, then by attainment.
"""

from __future__ import annotations

from autoscaler.slo import SloTarget
from simulator.planner.verdict import meets

DAY = 86400.0


def money(x: float, currency: str) -> str:
    return f"{x:,.2f} {currency}"


def assemble(plan, peak: float, days: dict, found: dict, runs: dict, oracles: dict, curves: dict) -> dict:
    per_day = DAY / plan.duration * plan.compress  # simulated curve -> one day
    first = days[plan.candidates[0].name]
    entries = [_candidate(plan, c, found[c.name], runs[c.name], oracles[c.name], curves, per_day,
                          float(days[c.name].output.sum()) * per_day) for c in plan.candidates]
    options = ranking(entries)
    slo = {m: {"percentile": t.percentile, "seconds": t.seconds}
           for m, t in ((m, SloTarget.from_yaml(m, v)) for m, v in plan.slo.items())}
    static_runs = sum(c["simulations"] for f in found.values() if f["static"] for c in f["static"]["checked"])
    return {
        "simulations": sum(len(r) for r in runs.values()) + static_runs + len(curves),
        "plan": plan.name,
        "currency": plan.currency,
        "seeds": plan.seeds,
        "workload": {
            "peak_rps": peak,
            "duration": plan.duration,
            "compress": plan.compress,
            "simulated_duration": plan.sim_duration,
            "requests_per_day": len(first) * per_day,
            "output_tokens_per_day": float(first.output.sum()) * per_day,
        },
        "slo": slo,
        "candidates": entries,
        "ranking": options,
        "invalid": [{"candidate": e["name"], "policy": name, "reason": p["invalid"]}
                    for e in entries for name, p in e["policies"].items() if p.get("invalid")],
        "answer": answer(entries, options, peak, plan.currency, slo),
    }


def _candidate(plan, cand, found: dict, runs: list, oracle, curves: dict, per_day: float, tokens_day: float):
    d = cand.deployment
    price = d.cost_per_hour
    out = {
        "name": cand.name,
        "deployment": d.name,
        "latency_model": d.pool["latency_model"],
        "engine": cand.engine,
        "gpus_per_replica": d.gpus_per_replica,
        "price_per_gpu_hour": d.price_per_gpu_hour,
        "offload_cost_per_replica_hour": d.offload_cost_per_hour,
        "capacity": found["capacity"],
        "capacity_runs": sorted(runs, key=lambda r: (r[0], r[1])),
        "static": None,
        "oracle": None,
        "policies": {},
    }
    st = found["static"]
    if st and st["replicas"]:
        n = st["replicas"]
        out["static"] = {**st, "gpus": n * d.gpus_per_replica, "cost_per_hour": n * price,
                         "cost_per_day": n * price * 24,
                         "cost_per_million_output_tokens": n * price * 24 / tokens_day * 1e6}
    elif st:
        out["static"] = st
    if oracle is not None:
        need, billed = oracle
        hours = float(billed.sum()) / 60 * per_day  # billed replica-minutes -> replica-hours a day
        out["oracle"] = {"peak_replicas": int(need.max()), "replica_hours_per_day": hours,
                         "cost_per_day": hours * price}
    for p in plan.policies:
        s = curves.get((cand.name, p.name))
        if s is not None:
            out["policies"][p.name] = {**_policy(s, d, per_day, tokens_day, out["oracle"]),
                                       "first_replicas": int(oracle[1][0])}
    return out


def _policy(s: dict, d, per_day: float, tokens_day: float, oracle: dict | None) -> dict:
    cost = s["costs"]["during_workload"] * per_day
    unmatched = s.get("unmatched_triggers", [])
    return {
        # a trigger that matched no series scaled on nothing: the run says nothing about the policy
        "invalid": "; ".join(f"trigger {w['trigger']} matched nothing ({w['hint']})" for w in unmatched)
        or None,
        "cost_per_day": cost,
        "gpu_hours_per_day": cost / d.cost_per_hour * d.gpus_per_replica,  # the tier's price left out
        "x_oracle": cost / oracle["cost_per_day"] if oracle and oracle["cost_per_day"] > 0 else None,
        "attainment": s["slo_attainment_joint"],
        "window_attainment": s["slo_window_attainment"],
        "met": meets(s),
        "slo": {k: v["value_at_percentile"] for k, v in s["slo"].items()},
        "peak_replicas": max(p["peak_replicas"] for p in s["pools"].values()),
        "cost_per_hour_at_peak": s["costs"]["per_hour_at_peak"],
        "scale_events": s["scale_events"],
        "cost_per_million_output_tokens": cost / tokens_day * 1e6 if tokens_day > 0 else None,
    }


def ranking(entries: list[dict]) -> list[dict]:
    """Every option (a candidate's static fleet, or a policy on it), best first, Pareto front marked
    (no other option is as cheap and as good with one of the two strictly better)."""
    options = []
    for e in entries:
        st, g = e["static"], e["gpus_per_replica"]
        if st and st["replicas"]:
            options.append({"candidate": e["name"], "policy": None, "cost_per_day": st["cost_per_day"],
                            "attainment": st["attainment_at_peak"], "met": True,
                            "replicas_at_peak": st["replicas"], "gpus_at_peak": st["gpus"],
                            "cost_per_hour_at_peak": st["cost_per_hour"],
                            "rechecked": "searched_replicas" in st})
        for name, p in e["policies"].items():
            if p.get("invalid"):
                continue  # not ranked: listed under "invalid" in plan.json and the report
            options.append({"candidate": e["name"], "policy": name, "cost_per_day": p["cost_per_day"],
                            "attainment": p["attainment"], "met": p["met"],
                            "replicas_at_peak": p["peak_replicas"], "gpus_at_peak": p["peak_replicas"] * g,
                            "cost_per_hour_at_peak": p["cost_per_hour_at_peak"]})
    # stable: ties keep the plan's order, a static fleet before the policies on it; of two static fleets
    # at one cost, the one re-checked at length first
    options.sort(key=lambda o: (not o["met"], o["cost_per_day"], not o.get("rechecked", True),
                                -(o["attainment"] or 0.0)))
    for o in options:
        a = o["attainment"] or 0.0
        o["pareto"] = not any(
            q["cost_per_day"] <= o["cost_per_day"] and (q["attainment"] or 0.0) >= a
            and (q["cost_per_day"] < o["cost_per_day"] or (q["attainment"] or 0.0) > a)
            for q in options
        )
    return options


def margin_at_peak(e: dict, peak: float, slo: dict) -> dict | None:
    """How close the answer's static fleet runs to its limits at the peak, from its longest run there:
    each SLO's value at its percentile (worst seed) against the target, the replicas' busy fraction, the
    rate a replica takes against one replica's capacity, and the count below that missed."""
    st = e["static"]
    if "slo_at_peak" not in st:
        return None
    load = peak / st["replicas"]
    cap = e["capacity"]["rps"]
    values = []
    for name, v in st["slo_at_peak"].items():
        target = slo[name]
        shown = "none finished" if v is None else f"{v:.3g} s"
        values.append(f"{name} p{target['percentile']:g} {shown} (target {target['seconds']:g} s)")
    text = (f"At the peak over {st['duration']:g} s on every seed: " + ", ".join(values)
            + f"; replicas busy {100 * st['busy_at_peak']:.0f}% of the time, {load:.3g} req/s each"
            + (f" ({100 * load / cap:.0f}% of one replica alone at capacity, {cap:.3g} req/s)" if cap else "")
            + ".")
    fewer = st.get("fewer_missed")
    if fewer:
        missed = ", ".join(f"{k} {v:.3g} s" for k, v in fewer["slo"].items() if v is not None)
        text += f" {fewer['replicas']} replicas missed over {fewer['duration']:g} s ({missed})."
    return {"slo": st["slo_at_peak"], "busy": st["busy_at_peak"], "rps_per_replica": load,
            "of_capacity": load / cap if cap else None, "duration": st["duration"],
            "fewer_missed": fewer, "text": text}


def answer(entries: list[dict], options: list[dict], peak: float, currency: str, slo: dict) -> dict:
    best = next((o for o in options if o["met"]), None)
    if best is None:
        return {"met": False, "text": f"No candidate meets every SLO at the peak of {peak:.3g} req/s."}
    e = next(x for x in entries if x["name"] == best["candidate"])
    st = e["static"]
    met = sorted((p["cost_per_day"], name) for name, p in e["policies"].items()
                 if p["met"] and not p.get("invalid"))
    engine = ", ".join(f"{k} {v}" for k, v in e["engine"].items())
    engine = f" ({engine})" if engine else ""
    replicas = "1 replica" if st["replicas"] == 1 else f"{st['replicas']} replicas"
    text = (f"{replicas} of {e['deployment']}{engine} = {st['gpus']} GPUs, "
            f"{money(st['cost_per_hour'], currency)}/h at the peak of {peak:.3g} req/s")
    policy = None
    if met:
        policy = met[0][1]
        p = e["policies"][policy]
        text += (f"; {money(p['cost_per_day'], currency)}/day autoscaled with policy {policy} at "
                 f"{100 * p['attainment']:.1f}% of requests within every SLO")
    text += f" ({money(st['cost_per_day'], currency)}/day as a static fleet)."
    margin = margin_at_peak(e, peak, slo)
    if margin:
        text += " " + margin["text"]
    return {"margin": margin, "met": True, "candidate": e["name"], "best_option": best,
            "replicas_at_peak": st["replicas"],
            "gpus_at_peak": st["gpus"], "cost_per_hour_at_peak": st["cost_per_hour"],
            "static_cost_per_day": st["cost_per_day"], "policy": policy,
            "policy_cost_per_day": e["policies"][policy]["cost_per_day"] if policy else None,
            "policy_attainment": e["policies"][policy]["attainment"] if policy else None, "text": text}
