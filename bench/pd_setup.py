"""The P/D day's setting, shared by bench/pd_day.py (the policy rows, the table) and bench/pd_bounds.py
(the oracle bound and the bound rows): the service (a prefill and a decode pool of H100 TP4 replicas,
2-minute startup), the SLOs, the day's requests (the bursty rate, the length mix moving from
summarisation to chat), the scenario a row runs and the row's measures.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repository's packages

from simulator.report import request_table, slo_meets  # noqa: E402
from simulator.run import build_workload, simulate  # noqa: E402
from simulator.scenario import load_scenario  # noqa: E402
from simulator.workload import Workload  # noqa: E402

STARTUP = 120.0
GPUS = 4
TTFT_SLO, TPOT_SLO = 3.0, 0.1
SLO = {"ttft": {"percentile": 90, "seconds": TTFT_SLO}, "tpot": {"percentile": 90, "seconds": TPOT_SLO}}
KV_BYTES = 327680
POOL = {"latency_model": "h100-llama2-70b-tp4", "max_num_seqs": 256, "max_num_batched_tokens": 8192,
        "max_model_len": 32768, "prefix_caching": False, "provisioning_delay": STARTUP, "cost_per_hour": 39.2,
        "kv_memory": {"gpu_memory_gib": 74.5, "num_gpus": GPUS, "utilization": 0.9, "weights_gib": 130.4,
                      "kv_bytes_per_token": KV_BYTES}}
PD = {"prefill_pool": "prefill", "decode_pool": "decode", "threshold": 1024,
      "link": {"bandwidth_gbs": 50, "latency_ms": 0.5}, "kv_bytes_per_token": KV_BYTES}
# (prompt mean, median, max), (output mean, median, max)
MIXES = {"summarise": ((6000, 4500, 16000), (150, 100, 1000)), "chat": ((800, 500, 4000), (450, 300, 2000))}
MAX_REPLICAS = 40
BURSTS = (0.25, 0.66)  # the two 3x bursts' starts, as fractions of the day (5 minutes each)
BURST_WINDOW = 600.0  # a burst and the 5 minutes after it, where its late requests are counted


def summarise_share(t: np.ndarray, day: float) -> np.ndarray:
    return np.interp(t / day, [0.0, 0.4, 0.6, 1.0], [0.85, 0.85, 0.1, 0.1])


def _lognormal(rng, n: int, mean: float, median: float, cap: float) -> np.ndarray:
    sigma = math.sqrt(2.0 * math.log(mean / median))
    return np.clip(np.round(rng.lognormal(math.log(median), sigma, n)), 1, cap).astype(np.int64)


def day_workload(hours: float, rate: float, seed: int) -> tuple[Workload, np.ndarray]:
    """(the day's requests, True where a request is a summarisation)."""
    day = hours * 3600
    arrivals = {"process": "gamma", "cv": 1.09, "diurnal": {"mean": rate, "amplitude": 0.7, "period": day},
                "spikes": [{"at": day * f, "duration": 300, "factor": 3.0, "ramp": 120} for f in BURSTS]}
    sc = load_scenario({"seed": seed, "duration": day,
                        "workload": {"arrivals": arrivals, "prompt_tokens": 1, "output_tokens": 1},
                        "pools": [{"name": "x", "latency_model": POOL["latency_model"]}]})
    times = build_workload(sc, seed).times
    rng = np.random.default_rng([seed, 30])
    long = rng.random(len(times)) < summarise_share(times, day)
    prompt, output = np.empty(len(times), np.int64), np.empty(len(times), np.int64)
    for name, sel in (("summarise", long), ("chat", ~long)):
        (pm, pmed, pmax), (om, omed, omax) = MIXES[name]
        prompt[sel] = _lognormal(rng, int(sel.sum()), pm, pmed, pmax)
        output[sel] = _lognormal(rng, int(sel.sum()), om, omed, omax)
    return Workload(times, prompt, output), long


def ia(name: str, policy: dict, polling: int = 15, max_replicas: int = MAX_REPLICAS,
       slo: dict | None = None) -> dict:
    """A pool's InferenceAutoscaler; `slo`: the target it sizes for (default the day's SLO)."""
    return {"spec": {"apiVersion": "slopilot.dev/v1alpha1", "kind": "InferenceAutoscaler",
                     "metadata": {"name": name},
                     "spec": {"scaleTargetRef": {"name": name}, "minReplicas": 1, "maxReplicas": max_replicas,
                              "pollingInterval": polling, "startupDelaySeconds": int(STARTUP),
                              "slo": slo or SLO, "policy": policy}}}


def hpa(name: str, query: str, per_replica: float) -> dict:
    trig = {"type": "prometheus", "name": "load", "metadata": {"query": query, "threshold": str(per_replica)}}
    return ia(name, {"type": "hpa", "hpa": {"triggers": [trig]}})


def scenario(day: float, prefill: dict, decode: dict, p0: int = 2, d0: int = 2, seed: int = 7) -> dict:
    return {"name": "pd-day", "seed": seed, "duration": day,
            "workload": {"arrivals": {"rate": 1}, "prompt_tokens": 1, "output_tokens": 1},
            "pools": [{**POOL, "name": "prefill", "replicas": p0, "labels": {"engine": "prefill"},
                       "autoscaler": prefill},
                      {**POOL, "name": "decode", "replicas": d0, "labels": {"engine": "decode"},
                       "autoscaler": decode}],
            "pd": PD, "router": {"policy": "least_outstanding"}, "slo": SLO,
            "metrics": {"scrape_interval": 15, "rate_window": 60}, "output": {"timeline_interval": 30},
            "drain": {"max": 900}}


def pool_counts(fleet) -> tuple[np.ndarray, np.ndarray]:
    """Prefill and decode replicas (provisioning + ready) at each timeline instant."""
    by: dict[float, list[int]] = {}
    for r in fleet.timeline:
        by.setdefault(r["time"], [0, 0])[0 if r["pool"] == "prefill" else 1] += r["ready"] + r["provisioning"]
    rows = [by[t] for t in sorted(by)]
    return np.array([r[0] for r in rows]), np.array([r[1] for r in rows])


def row(name: str, res, wall: float) -> dict:
    fleet = res.fleet
    req = request_table(fleet)
    arrived = np.arange(len(req["arrival"])) < fleet.arrived
    att, late = {}, {}
    ok = np.ones(int(arrived.sum()), dtype=bool)
    t = req["arrival"][arrived]
    in_bursts = np.zeros(len(t), dtype=bool)
    for f in BURSTS:
        in_bursts |= (t >= f * fleet.sc.duration) & (t < f * fleet.sc.duration + BURST_WINDOW)
    for slo in fleet.sc.slos:
        m = slo_meets(req, slo, arrived)
        att[slo.metric] = float(m.mean())
        late[slo.metric] = [int((~m).sum()), int((~m & in_bursts).sum())]
        ok &= m
    p, d = pool_counts(fleet)
    ratio = p / np.maximum(d, 1)
    return {"policy": name, "requests": int(arrived.sum()), "ttft_attainment": att.get("ttft"),
            "tpot_attainment": att.get("tpot"), "attainment": float(ok.mean()),
            "gpu_hours": res.summary["costs"]["gpu_hours"],
            "pd_ratio": [float(ratio.min()), float(ratio.max())],
            "prefill_range": [int(p.min()), int(p.max())],
            "decode_range": [int(d.min()), int(d.max())],
            "scale_events": sum(len(pl.scale_events) for pl in fleet.pools), "late": late, "wall_s": wall}


def run_row(name: str, sc: dict, wl: Workload) -> dict:
    t = time.perf_counter()
    res = simulate(load_scenario(sc), None, workload=wl, plots=False)
    return row(name, res, time.perf_counter() - t)
