"""The live controller end to end: a real Prometheus scraping emulated engines (`serve --emulate`), the
controller scaling the local process fleet under a load ramp, once with a KEDA ScaledObject on the
waiting queue and once with the sloModel InferenceAutoscaler (the engines' own latency model).

Each run prints its figures: when the metric crossed the threshold (from Prometheus's own series,
query_range) against when the scale-up was ordered (the decision log), when it went idle against
when it scaled back down, and the replica counts over time. Then the run's decision log goes through
the same policy in the two other places: `slopilot replay` and the simulator's reconcile step, which
must give the same decisions row for row (desired_replicas, active, reason).

Timing bounds are those of the contract (an order within two polling intervals of the crossing, a
scale-down no sooner than the stabilization window and within two polls after it), measured on a
machine whose two cores are shared: the polling interval (2 s) and scrape interval (1 s) leave room.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from autoscaler.reconcile import reconcile
from autoscaler.replay import observation
from autoscaler.series import read_series
from autoscaler.slo_model import replicas_needed
from autoscaler.spec import load_spec, make_policy
from controlplane.fleet import load_fleet_config
from controlplane.localrun import LocalRun
from simulator.autoscaling import PoolTarget
from simulator.latency import load_latency_model

ROOT = Path(__file__).resolve().parents[2]
MODEL = "h100-llama2-70b-tp4"  # the emulated engines' step-time model, and the sloModel policy's
POLL = 2.0  # seconds: every spec's polling interval here
SCRAPE = 1.0  # seconds: Prometheus's scrape interval
PROMPT, OUTPUT = 256, 32  # tokens per request (fixed, so the sloModel threshold is known in advance)

# -- the three places ------------------------------------------------------------------------------


def yaml_text(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def read_log(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def decisions(rows: list[dict]) -> list[tuple[int, bool, str]]:
    return [(int(r["desired_replicas"]), r["active"] == "true", r["reason"]) for r in rows]


def replay_cli(spec_path: Path, log_path: Path, latency_model: str | None = None) -> list[dict]:
    """`slopilot replay --spec SPEC --metrics LOG` as a user runs it; its decisions CSV as rows."""
    cmd = [sys.executable, "-m", "slopilot.cli", "replay", "--spec", str(spec_path),
           "--metrics", str(log_path)]
    if latency_model:
        cmd += ["--step-model", latency_model]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return list(csv.DictReader(done.stdout.splitlines()))


class RecordingFleet:
    """What the simulator's PoolTarget scales (fleet.set_desired), reduced to a record."""

    def __init__(self):
        self.applied: list[int] = []

    def set_desired(self, pool, desired: int, reason: str) -> None:
        self.applied.append(desired)


def simulator_step(spec_path: Path, log_path: Path, latency_model=None) -> list[tuple[int, bool, str]]:
    """The decision log's rows through the simulator's step: autoscaler.reconcile into its PoolTarget."""
    spec = load_spec(spec_path.read_text())
    policy = make_policy(spec, latency_model=latency_model)
    with open(log_path, newline="") as f:
        rows, _ = read_series(f, [t.name for t in spec.triggers], str(log_path))
    fleet = RecordingFleet()
    target = PoolTarget(fleet, pool=None)
    out, applied, current = [], [], spec.min_replicas
    for row in rows:
        step = reconcile(policy, observation(row, row.time, current), target)
        d = step.decision
        out.append((d.desired_replicas, d.active, d.reason))
        applied.append(step.desired)
        current = step.desired
    assert fleet.applied == applied  # every clamped decision reached the pool
    return out


def assert_three_places(spec_path: Path, log_path: Path, latency_model: str | None = None) -> int:
    """The live decisions, `slopilot replay`'s and the simulator step's: equal row for row."""
    live = decisions(read_log(log_path))
    replayed = replay_cli(spec_path, log_path, latency_model)
    assert len(replayed) == len(live)
    for i, (a, b) in enumerate(zip(live, decisions(replayed))):
        assert a == b, f"row {i + 2} of {log_path.name}: live {a} != replay {b}"
    model = load_latency_model(latency_model) if latency_model else None
    sim = simulator_step(spec_path, log_path, model)
    for i, (a, b) in enumerate(zip(live, sim)):
        assert a == b, f"row {i + 2} of {log_path.name}: live {a} != simulator step {b}"
    return len(live)


# -- Prometheus's own view -----------------------------------------------------------------------


def query_range(url: str, query: str, start: float, end: float, step: float = 0.25
                ) -> list[tuple[float, float]]:
    params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    body = httpx.get(f"{url}/api/v1/query_range", params=params, timeout=30, trust_env=False).json()
    assert body["status"] == "success", body
    result = body["data"]["result"]
    assert len(result) <= 1, f"{query}: {len(result)} series"
    return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []


def first_sustained(series: list[tuple[float, float]], above: float, hold: float) -> float | None:
    """Start of the first stretch where the value stays > `above` for at least `hold` seconds: a
    stretch shorter than a poll no polling controller can be asked to see."""
    start = None
    for t, v in series:
        if v > above and start is None:
            start = t
        elif v <= above:
            start = None
        if start is not None and t - start >= hold:
            return start
    return None


def quiet_since(series: list[tuple[float, float]], level: float) -> float | None:
    """Start of the final stretch where the value stays <= `level` (None when it ends above)."""
    since = None
    for t, v in series:
        if v > level:
            since = None
        elif since is None:
            since = t
    return since


# -- the run -------------------------------------------------------------------------------------


def fleet_config(autoscaler: dict, ramp: list[list[float]], max_num_seqs: int = 4) -> dict:
    return {"name": "e2e", "emulate": MODEL, "engine": {"max_num_seqs": max_num_seqs},
            "replicas": 1, "min_replicas": 1, "max_replicas": 3, "drain_timeout": 5, "start_timeout": 60,
            "scrape_interval": SCRAPE, "autoscaler": autoscaler,
            "load": {"arrivals": {"piecewise": ramp}, "prompt_tokens": PROMPT, "output_tokens": OUTPUT,
                     "routing": "least_outstanding", "seed": 1}}


def scale_orders(rows: list[dict]) -> list[tuple[float, int, int, str]]:
    """(time, from, to, reason) of every applied change of the replica count."""
    out, last = [], int(rows[0]["current_replicas"])
    for r in rows:
        if r["scale_error"]:
            continue
        to = int(r["desired_replicas"])
        if to != last:
            out.append((float(r["time"]), last, to, r["reason"]))
            last = to
    return out


def print_timeline(rows: list[dict], t0: float, triggers: list[str]) -> None:
    print(f"{'t (s)':>7} {'current':>7} {'ready':>5} {'desired':>7}  " + " ".join(f"{n:>8}" for n in triggers)
          + "  reason")
    for r in rows:
        values = " ".join(f"{r[n][:8]:>8}" for n in triggers)
        print(f"{float(r['time']) - t0:7.1f} {r['current_replicas']:>7} {r['ready_replicas']:>5} "
              f"{r['desired_replicas']:>7}  {values}  {r['reason'][:90]}")


def wait_rows(log: Path, check, timeout: float, what: str) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        rows = read_log(log) if log.exists() else []
        if rows and check(rows):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.5)


KEDA_QUEUE = {
    "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "e2e-queue"},
    "spec": {
        "scaleTargetRef": {"name": "e2e"}, "pollingInterval": POLL, "cooldownPeriod": 10,
        "minReplicaCount": 1, "maxReplicaCount": 3,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleDown": {"stabilizationWindowSeconds": 10}}}},
        "triggers": [{"type": "prometheus", "name": "queue", "metadata": {
            "serverAddress": "http://127.0.0.1:9090", "query": "sum(vllm:num_requests_waiting)",
            "threshold": "4"}}],
    },
}
# 1 req/s, a ramp to 10 req/s (one replica serves about 4 with 4 sequences at a time), then nothing
QUEUE_RAMP = [[0, 1], [6, 1], [12, 10], [22, 10], [22.01, 0], [24, 0]]


def check_scale_ups(orders, series, level_of, t0: float, what: str) -> None:
    """Each scale-up from n replicas is justified (the series was above level_of(n) at or before the
    order, a single sample is enough: the HPA acts on the one value it reads) and prompt: ordered
    within two polls of the crossing (the first crossing held for at least a poll, or the sample the
    controller acted on when it saw a shorter spike), counted from when the count became n."""
    became = t0
    print(f"{'from':>4} {'to':>3} {'level':>7} {'crossed (s)':>11} {'ordered (s)':>11} {'lag (s)':>7}")
    for t, a, b, _ in orders:
        if b > a:
            after = [(u, v) for u, v in series if became <= u <= t + POLL]
            seen = first_sustained(after, level_of(a), 0.0)
            assert seen is not None and seen <= t + 0.5, \
                f"scale-up {a} -> {b} at {t - t0:.1f} s without a crossing of {what}"
            held = first_sustained(after, level_of(a), POLL)
            crossing = held if held is not None and held <= t else seen
            print(f"{a:>4} {b:>3} {level_of(a):>7.2f} {crossing - t0:>11.1f} {t - t0:>11.1f} "
                  f"{t - crossing:>+7.2f}")
            assert t - crossing <= 2 * POLL, f"scale-up {a} -> {b}: {t - crossing:.2f} s after the crossing"
        became = t


def run_keda_queue(tmp_path: Path, ramp: list[list[float]], max_replicas: int) -> None:
    """The KEDA queue ScaledObject on a local fleet under `ramp`; checks and prints the figures."""
    spec = {**KEDA_QUEUE, "spec": {**KEDA_QUEUE["spec"], "maxReplicaCount": max_replicas}}
    cfg = load_fleet_config({**fleet_config(spec, ramp), "max_replicas": max_replicas})
    window = 10.0
    threshold = 4.0
    with LocalRun(cfg, tmp_path, rate_window=10.0) as run:
        t0 = run.started
        log = tmp_path / "decisions.csv"
        # up, and back to the minimum once the load is over
        wait_rows(log, lambda rs: any(int(r["desired_replicas"]) > 1 for r in rs), 90, "scale-up")
        wait_rows(log, lambda rs: run.load_result is not None, ramp[-1][0] + 60, "the load's end")
        load_end = time.time()
        rows = wait_rows(log, lambda rs: (lambda o: bool(o) and o[-1][2] == 1 and o[-1][0] > load_end - 20)(
            scale_orders(rs)), 90, "scale-down to 1")
        end = time.time()
        prom = run.prometheus.url
        series = query_range(prom, "sum(vllm:num_requests_waiting)", t0, end)
        replicas = query_range(prom, 'count(up{job="engines"} == 1)', t0, end, 1.0)
        requests = run.load_result.summary()
    print_timeline(rows, t0, ["queue"])
    orders = scale_orders(rows)
    print("scale orders (s, from, to):", [(round(t - t0, 1), a, b) for t, a, b, _ in orders])
    print("engines Prometheus scraped, every 4 s:", [int(v) for _, v in replicas[::4]])
    print(f"requests: {requests['ok']}/{requests['requests']} ok, TTFT p90 {requests['ttft_s']['p90']:.2f} s")
    assert max(b for _, _, b, _ in orders) >= 2 and max(v for _, v in replicas) >= 2

    # the HPA acts when queue / (threshold * current) leaves its tolerance band (0.1)
    check_scale_ups(orders, series, lambda n: threshold * n * 1.1, t0, "the queue")

    # idle: the queue at or below one replica's share; the scale to 1 waits the stabilization window
    quiet = quiet_since(series, threshold)
    down_t = orders[-1][0]
    print(f"queue <= {threshold:g} from {quiet - t0:.1f} s; scale-down to 1 ordered at {down_t - t0:.1f} s: "
          f"{down_t - quiet:+.2f} s after (window {window:g} s, bounds [{window - 2 * POLL:g}, "
          f"{window + 2 * POLL:g}])")
    assert window - 2 * POLL <= down_t - quiet <= window + 2 * POLL

    n = assert_three_places(run.spec_path, log)
    print(f"{n} decisions identical live, in `slopilot replay` and in the simulator step")


@pytest.mark.timeout(240)
def test_keda_queue_scales_up_on_the_crossing_and_down_after_stabilization(tmp_path):
    run_keda_queue(tmp_path, QUEUE_RAMP, max_replicas=3)


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_keda_queue_two_waves_up_to_four_engines(tmp_path):
    # two waves, the second steeper, with a lull between them long enough to scale down
    ramp = [[0, 1], [6, 1], [14, 12], [30, 12], [31, 1], [55, 1], [62, 15], [80, 15], [80.01, 0], [82, 0]]
    run_keda_queue(tmp_path, ramp, max_replicas=4)


SLO_MODEL = {
    "apiVersion": "slopilot.dev/v1alpha1", "kind": "InferenceAutoscaler", "metadata": {"name": "e2e-slo"},
    "spec": {
        "scaleTargetRef": {"name": "e2e"}, "minReplicas": 1, "maxReplicas": 3, "pollingInterval": POLL,
        "startupDelaySeconds": 4,
        "slo": {"ttft": {"percentile": 90, "seconds": 1.0}, "tpot": {"percentile": 90, "seconds": 0.04}},
        "policy": {"type": "sloModel", "sloModel": {
            "margin": 0.15, "forecastWindowSeconds": 20, "trendWindowSeconds": 10,
            "scaleDownDelaySeconds": 12}},
    },
}
# one replica meets the TPOT SLO up to about 2.4 req/s of these requests (the policy's own model)
SLO_RAMP = [[0, 1], [6, 1], [14, 6], [24, 6], [24.01, 0], [26, 0]]


NEED = re.compile(r"-> (\d+) replicas")


def one_replica_limit(policy, prompt: float, output: float) -> float:
    """The arrival rate above which the policy's model wants a second replica (bisection)."""
    def need(rate: float) -> int:
        return replicas_needed(policy.model, rate, prompt, output, policy.slos, policy.margin, 1,
                               policy.max_replicas, policy.max_batch, policy.prompt_cv)

    lo, hi = 0.01, 100.0
    assert need(lo) == 1 and need(hi) > 1
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if need(mid) == 1 else (lo, mid)
    return hi


@pytest.mark.timeout(240)
def test_slo_model_scales_up_on_the_crossing_and_down_after_the_delay(tmp_path):
    cfg = load_fleet_config(fleet_config(SLO_MODEL, SLO_RAMP, max_num_seqs=16))
    rate_window, delay = 10.0, 12.0
    limit = one_replica_limit(make_policy(cfg.autoscaler, latency_model=load_latency_model(MODEL)),
                              PROMPT, OUTPUT)
    with LocalRun(cfg, tmp_path, rate_window=rate_window) as run:
        t0 = run.started
        log = tmp_path / "decisions.csv"
        wait_rows(log, lambda rs: any(int(r["desired_replicas"]) > 1 for r in rs), 90, "scale-up")
        rows = wait_rows(log, lambda rs: (lambda o: bool(o) and o[-1][2] == 1)(scale_orders(rs)), 90,
                         "scale-down to 1")
        end = time.time()
        series = query_range(run.prometheus.url, f"sum(rate(vllm:request_success_total[{rate_window:g}s]))",
                             t0, end)
    print_timeline(rows, t0, ["arrival_rate", "mean_prompt_tokens", "mean_output_tokens"])
    orders = scale_orders(rows)
    print("scale orders:", [(round(t - t0, 1), a, b) for t, a, b, _ in orders])
    mixes = [(float(r["mean_prompt_tokens"]), float(r["mean_output_tokens"])) for r in rows
             if r["mean_prompt_tokens"] not in ("", "error")]
    # ratios of two rates over the window: the sent mix, but for Prometheus's extrapolation of rate(),
    # which differs between the two counters while the window still reaches back to their start
    prompts, outputs = sorted(p for p, _ in mixes), sorted(o for _, o in mixes)
    print(f"length mix the policy read: prompt {prompts[0]:.1f}..{prompts[-1]:.1f}, output "
          f"{outputs[0]:.2f}..{outputs[-1]:.2f} tokens (sent {PROMPT}, {OUTPUT})")
    mid = len(mixes) // 2
    assert abs(prompts[mid] / PROMPT - 1) < 0.01 and abs(outputs[mid] / OUTPUT - 1) < 0.01

    crossing = first_sustained(series, limit, POLL)
    up_t = next(t for t, a, b, _ in orders if b > a)
    print(f"arrival rate > {limit:.2f} req/s (one replica's limit) for a poll from {crossing - t0:.1f} s; "
          f"scale-up ordered at {up_t - t0:.1f} s: {up_t - crossing:+.2f} s (bound {2 * POLL:g} s; the "
          f"policy forecasts {cfg.autoscaler.startup_delay:g} s ahead, so it may lead)")
    assert crossing is not None and up_t - crossing <= 2 * POLL
    assert up_t - t0 >= SLO_RAMP[1][0]  # not before the ramp began

    # the scale to 1 waits scaleDownDelay after the last poll that needed more (the policy's own
    # sizing, from its reason); from Prometheus's view the falling trend it still extrapolates adds a poll
    down_t = orders[-1][0]
    needs = [(float(r["time"]), int(m.group(1))) for r in rows if (m := NEED.search(r["reason"]))]
    last_need = max(t for t, n in needs if n > 1 and t < down_t)
    quiet = quiet_since(series, limit)
    print(f"last poll needing > 1 replica at {last_need - t0:.1f} s, arrival rate <= {limit:.2f} req/s from "
          f"{quiet - t0:.1f} s; scale-down to 1 ordered at {down_t - t0:.1f} s: {down_t - last_need:+.2f} s "
          f"and {down_t - quiet:+.2f} s after (scaleDownDelay {delay:g} s)")
    assert delay <= down_t - last_need <= delay + POLL + 1.0
    assert delay - 2 * POLL <= down_t - quiet <= delay + 3 * POLL

    n = assert_three_places(run.spec_path, log, MODEL)
    print(f"{n} decisions identical live, in `slopilot replay` and in the simulator step")


def test_slo_model_idle_fleet_goes_to_the_minimum_after_the_delay():
    """What the live run showed: an idle fleet finishes no request, so it has no length mix; the
    policy still sizes it for the minimum once the delay has passed (it used to hold forever)."""
    from autoscaler.observation import Observation

    policy = make_policy(load_spec(yaml_text(SLO_MODEL)), latency_model=load_latency_model(MODEL))
    assert policy.decide(Observation(0.0, 2, 2, arrival_rate=0.0)).desired_replicas == 2  # no history
    busy = Observation(2.0, 2, 2, arrival_rate=6.0, mean_prompt_tokens=PROMPT, mean_output_tokens=OUTPUT)
    assert policy.decide(busy).desired_replicas == 3
    idle = [policy.decide(Observation(t, 3, 3, arrival_rate=0.0, num_waiting=0.0)) for t in (4.0, 12.0, 16.0)]
    assert [d.desired_replicas for d in idle] == [3, 3, 1]  # scaleDownDelaySeconds 12 after t = 2
    waiting = policy.decide(Observation(18.0, 1, 1, arrival_rate=0.0, num_waiting=3.0))
    assert waiting.reason.endswith("no change") and waiting.desired_replicas == 1


def test_fleet_file_router_takes_the_load_and_prometheus_scrapes_it(tmp_path):
    # FLEET.yaml `router: true`: the router stands in front of the replicas, the load goes through
    # it, and the fleet's Prometheus scrapes its metrics beside the engines'
    ramp = [[0, 2], [8, 2], [8.01, 0], [9, 0]]
    cfg = load_fleet_config({**fleet_config(KEDA_QUEUE, ramp), "router": True})
    with LocalRun(cfg, tmp_path, rate_window=10.0) as run:
        assert run.router is not None
        wait_rows(tmp_path / "decisions.csv", lambda rs: run.load_result is not None, 60, "the load's end")
        requests = run.load_result.summary()
        served = sum(ep.served for ep in run.router.state.pool.endpoints.values())
        prom = run.prometheus.url

        def scraped() -> float:
            r = httpx.get(f"{prom}/api/v1/query", params={"query": "sum(llm_d_epp_request_total)"},
                          timeout=10, trust_env=False).json()["data"]["result"]
            return float(r[0]["value"][1]) if r else -1.0

        deadline = time.time() + 20
        while scraped() < requests["requests"] and time.time() < deadline:
            time.sleep(0.5)
        total = scraped()
        up = httpx.get(f"{prom}/api/v1/query", params={"query": 'up{replica="router"}'}, timeout=10,
                       trust_env=False).json()["data"]["result"]
    print(f"requests {requests['ok']}/{requests['requests']} ok; router dispatched {served}; "
          f"Prometheus read llm_d_epp_request_total = {total:g}")
    assert requests["requests"] >= 10 and requests["ok"] == requests["requests"]
    assert served == requests["requests"] and total == requests["requests"]
    assert [float(s["value"][1]) for s in up] == [1.0]
