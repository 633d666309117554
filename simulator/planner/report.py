"""The plan's output folder: plan.json, report.html (the answer, the ranked table, the candidates, the
Pareto plot and the capacity curves) and scenarios/: for every candidate, as `slopilot simulate` files
(the first seed; --seed for the others) to reproduce any number, the capacity run at the capacity found
and at the next rate of the grid, the static fleet at the peak, and each policy over the curve."""

from __future__ import annotations

import html
import json
from pathlib import Path

import yaml

from simulator.planner.fmt import num, percent, span, yes_no
from simulator.planner.plots import capacity_figure, pareto_figure, save
from simulator.planner.rank import money
from simulator.planner.scenarios import capacity_scenario, curve_scenario, peak_scenario

STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;"
         "margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}img{max-width:100%}")


IMAGE_TITLES = {"pareto": "Cost against SLO attainment", "capacity": "What one replica serves"}


def write_plan_outputs(plan, result: dict, out: Path, plots: bool = True) -> list[str]:
    """Writes the folder; returns the names of the files written at its top."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    write_scenarios(plan, result, out / "scenarios")
    images = [save(pareto_figure(result), out / "pareto.png"),
              save(capacity_figure(result), out / "capacity.png")] if plots else []
    (out / "report.html").write_text(plan_html(result, images))
    return ["plan.json", "report.html", *images]


def scenario_name(candidate: str, what: str) -> str:
    return f"{candidate}-{what}".replace("/", "_").replace("=", "").replace(" ", "_") + ".yaml"


def write_scenarios(plan, result: dict, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    peak = result["workload"]["peak_rps"]
    for cand, entry in zip(plan.candidates, result["candidates"]):
        cap = entry["capacity"]
        if cap["rps"] > 0:
            _dump(capacity_scenario(plan, cand, cap["rps"]), folder / scenario_name(cand.name, "capacity"))
            if cap["next_rps"] is not None:
                _dump(capacity_scenario(plan, cand, cap["next_rps"]),
                      folder / scenario_name(cand.name, "capacity-next"))
        st = entry["static"]
        if not (st and st["replicas"]):
            continue
        _dump(peak_scenario(plan, cand, st["replicas"], peak, st.get("duration")),
              folder / scenario_name(cand.name, "peak"))
        for p in plan.policies:
            if p.name in entry["policies"]:
                first = entry["policies"][p.name]["first_replicas"]
                sc = curve_scenario(plan, cand, p.autoscaler, first, p.name)
                _dump(sc, folder / scenario_name(cand.name, p.name))


def _dump(scenario: dict, path: Path) -> None:
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))


def _cell(v) -> str:
    if isinstance(v, bool):
        return yes_no(v)
    if isinstance(v, float):
        return num(v)
    return "-" if v is None else html.escape(str(v))


def _money(x: float | None, currency: str) -> str | None:
    return None if x is None else money(x, currency)


def html_table(head: list[str], rows: list[list]) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in r) + "</tr>" for r in rows]
    return "".join(out) + "</table>"


def plan_html(result: dict, images: list[str]) -> str:
    cur = result["currency"]
    w = result["workload"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>slopilot plan: "
             f"{html.escape(result['plan'])}</title><style>{STYLE}</style></head><body>",
             f"<h1>Capacity plan: {html.escape(result['plan'])}</h1>",
             f"<p><b>{html.escape(result['answer']['text'])}</b></p>",
             f"<p>Peak {w['peak_rps']:.3g} req/s; {w['requests_per_day']:,.0f} requests and "
             f"{w['output_tokens_per_day']:,.0f} output tokens a day; the curve of {span(w['duration'])} "
             f"simulated in {span(w['simulated_duration'])} (x{w['compress']:g}); seeds "
             f"{', '.join(map(str, result['seeds']))}.</p>",
             "<h2>Ranked options</h2>"]
    rows = [[i + 1, o["candidate"], o["policy"] or "static (peak)", o["replicas_at_peak"], o["gpus_at_peak"],
             money(o["cost_per_hour_at_peak"], cur), money(o["cost_per_day"], cur),
             percent(o["attainment"], 2), yes_no(o["met"]), "yes" if o["pareto"] else ""]
            for i, o in enumerate(result["ranking"])]
    parts.append(html_table(["#", "candidate", "policy", "replicas at peak", "GPUs at peak", "cost/h at peak",
                         "cost/day", "attainment", "SLOs met", "Pareto"], rows))
    if result.get("invalid"):
        parts.append("<h2>Invalid, not ranked</h2>")
        parts.append(html_table(["candidate", "policy", "why"],
                                [[b["candidate"], b["policy"], f"invalid: {b['reason']}"]
                                 for b in result["invalid"]]))
    parts.append("<h2>Candidates</h2>")
    rows = []
    for c in result["candidates"]:
        cap, st, orc = c["capacity"], c["static"] or {}, c["oracle"] or {}
        rows.append([c["name"], c["latency_model"], c["gpus_per_replica"],
                     money(c["price_per_gpu_hour"], cur), f"{num(cap['rps'])} req/s",
                     f"{num(cap['spread']['min'])}-{num(cap['spread']['max'])} req/s",
                     st.get("replicas"), *(_money(st.get(k), cur) for k in ("cost_per_hour",
                                                                          "cost_per_million_output_tokens")),
                     _money(orc.get("cost_per_day"), cur)])
    parts.append(html_table(["candidate", "latency model", "GPUs a replica", "price a GPU-hour",
                         "capacity (a replica)", "over seeds", "static replicas", "static cost/h",
                         "static cost per M output tokens", "oracle bound cost/day"], rows))
    for img in images:
        title = IMAGE_TITLES.get(Path(img).stem, Path(img).stem)
        parts.append(f"<h2>{html.escape(title)}</h2><img src='{html.escape(img)}'>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
