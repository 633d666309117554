"""Controller scale: 1,000 autoscalers against a Prometheus-compatible stub, polled every 15 s.

The stub (a separate process, so its CPU is not the controller's) answers every /api/v1/query with
one sample after about 1 ms. The controller runs as `slopilot control` would: each ScaledObject with
its own Prometheus source (prometheus-api-client) and a target that holds a number, five workers (the
Kubernetes HPA controller's default, with its 15-s sync period, for scale). Reported: the
controller's CPU per 15-s round as a share of one core (target < 25%) and the reconcile latency
p50/p99 (target p99 < 200 ms); the workers are also varied, as the baseline, in the same run.

    .venv/bin/python bench/controller_scale.py [--autoscalers 1000] [--rounds 3] [--workers 5,1] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoscaler import load_spec, make_policy  # noqa: E402
from controlplane.controller import AutoscalerLoop, Controller  # noqa: E402
from controlplane.sources import PrometheusSource  # noqa: E402
from controlplane.targets import MemoryTarget  # noqa: E402

STUB = """
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
BODY = json.dumps({"status": "success", "data": {"resultType": "vector",
                   "result": [{"metric": {}, "value": [0, "12"]}]}}).encode()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def _answer(self):
        time.sleep(0.001)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    do_GET = do_POST = _answer
    def log_message(self, *a):
        pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
s.daemon_threads = True
print(s.server_port, flush=True)
s.serve_forever()
"""

SPEC = """
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: llama-{i}}}
spec:
  scaleTargetRef: {{name: llama-{i}}}
  pollingInterval: {interval}
  minReplicaCount: 1
  maxReplicaCount: 50
  triggers:
    - type: prometheus
      name: queue
      metadata: {{serverAddress: "{url}", query: "sum(vllm:num_requests_waiting{{pod=~'llama-{i}-.*'}})",
                  threshold: "5"}}
"""


def measure(url: str, n: int, workers: int, interval: float, rounds: int) -> dict:
    loops, durations = [], []
    for i in range(n):
        spec = load_spec(SPEC.format(i=i, url=url, interval=int(interval)))
        loop = AutoscalerLoop(spec, make_policy(spec), PrometheusSource(url), MemoryTarget(1))
        tick = loop.tick

        def timed(now, tick=tick):
            t = time.perf_counter()
            try:
                return tick(now)
            finally:
                durations.append(time.perf_counter() - t)

        loop.tick = timed
        loops.append(loop)
    stop = threading.Event()
    ctl = threading.Thread(target=Controller(loops, workers=workers).run, args=(stop,))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    ctl.start()
    time.sleep(interval * rounds)
    stop.set()
    ctl.join()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    for lp in loops:
        lp.source.close()
    q = statistics.quantiles(durations, n=100)
    return {"workers": workers, "reconciles": len(durations), "expected": n * rounds,
            "cpu_per_round": cpu / (wall / interval), "core_share": cpu / wall,
            "p50_ms": 1000 * statistics.median(durations), "p99_ms": 1000 * q[98]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--autoscalers", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3, help="15-s rounds to measure")
    ap.add_argument("--interval", type=float, default=15.0)
    ap.add_argument("--workers", default="5,1", help="worker counts to compare (the first is ours)")
    ap.add_argument("--json", help="also write the results here (bench/pages.py renders them)")
    args = ap.parse_args()
    stub = subprocess.Popen([sys.executable, "-c", STUB], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{stub.stdout.readline().strip()}"
        results = [measure(url, args.autoscalers, int(w), args.interval, args.rounds)
                   for w in args.workers.split(",")]
    finally:
        stub.terminate()
        stub.wait()
    for r in results:
        print(f"{args.autoscalers} autoscalers, {r['workers']} workers, {args.rounds} rounds of "
              f"{args.interval:g} s: "
              f"{r['reconciles']} reconciles ({r['expected']} due); CPU {r['cpu_per_round']:.2f} s a round = "
              f"{100 * r['core_share']:.1f}% of one core (target < 25%); reconcile p50 {r['p50_ms']:.1f} ms, "
              f"p99 {r['p99_ms']:.1f} ms (target p99 < 200 ms)")
    if len(results) > 1:
        a, b = results[0], results[1]
        print(f"ratios {a['workers']} vs {b['workers']} workers: p99 x{a['p99_ms'] / b['p99_ms']:.2f}, "
              f"CPU x{a['core_share'] / b['core_share']:.2f}")
    print(json.dumps(results))
    if args.json:
        from bench.pages import write_result

        write_result(args.json, ["workers", "reconciles (due)", "controller CPU per round",
                                 "share of one core", "reconcile p50", "p99"],
                     [[r["workers"], f"{r['reconciles']} ({r['expected']})", f"{r['cpu_per_round']:.2f} s",
                       f"{100 * r['core_share']:.1f}%", f"{r['p50_ms']:.1f} ms", f"{r['p99_ms']:.1f} ms"]
                      for r in results],
                     notes=[f"{args.autoscalers} KEDA ScaledObjects, one Prometheus trigger each, polled "
                            f"every {args.interval:g} s for {args.rounds} rounds against a stub answering "
                            "after 1 ms (targets: < 25% of one core, reconcile p99 < 200 ms)."])


if __name__ == "__main__":
    main()
