"""Restart and failover of `slopilot control --kube` processes.

A controller SIGKILLed inside a scale-down stabilization window and restarted resumes from the
autoscaler's status: it keeps the replicas until the window the first one started runs out, then
scales down once (no flap). With two controller replicas exactly one writes: the audit log shows no
scale, status or Event write from the follower. Killing the leader hands over within the lease
duration plus one retry period (short timings here; controller-runtime's 15/10/2 s in the slow test).
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.kube.helpers import SYSTEM_NS, deployment, queue_autoscaler, set_ready, wait_for

FAST = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5")
WRITES = {"create", "update", "patch", "delete"}


def setup(cluster, metrics_page, waiting: float, window: int | None = None):
    ns = cluster.namespace("t")
    cluster.apply(deployment("llama"), ns)
    set_ready(cluster, ns, "llama", 1)
    page = metrics_page(waiting)
    page.pod(cluster, ns, "llama-0", {"app": "llama"})
    extra = {}
    if window is not None:
        extra["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleDown": {"stabilizationWindowSeconds": window}}}}
    cluster.apply(queue_autoscaler("llama", "llama", poll=1.0, **extra), ns)
    return page


def replicas(cluster) -> int:
    return cluster.get("apps/v1", "Deployment", "t", "llama")["spec"]["replicas"]


def history(cluster) -> list[int]:
    out = []
    for _, key, ns, _, obj, _ in list(cluster.store.history):
        if key == ("apps", "deployments") and ns == "t":
            n = obj["spec"]["replicas"]
            if not out or out[-1] != n:
                out.append(n)
    return out


def kill(proc) -> float:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return time.time()


def test_a_restarted_controller_resumes_from_the_status_without_flapping(cluster, metrics_page):
    window = 24
    page = setup(cluster, metrics_page, waiting=8, window=window)  # queue 8, threshold 2: 4 replicas
    first = cluster.controller_process("--namespace", "t", "--scrape-interval", "0.5", *FAST, pod="ctl-a")
    wait_for(lambda: replicas(cluster) == 4, 30, "scale-up to 4")
    page.waiting = 0
    dropped = time.time()
    time.sleep(5)  # inside the stabilization window: the first controller holds 4
    assert replicas(cluster) == 4
    killed = kill(first)
    second = cluster.controller_process("--namespace", "t", "--scrape-interval", "0.5", *FAST, pod="ctl-b")
    wait_for(lambda: replicas(cluster) == 1, 40, "the scale-down after the window")
    down = next(e["time"] for e in cluster.controller_requests()
                if (e["pod"], e["verb"], e["resource"], e["subresource"], e["code"]) ==
                ("ctl-b", "update", "deployments", "scale", 200))
    took_over = next(e["time"] for e in cluster.controller_requests()
                     if e["pod"] == "ctl-b" and e["resource"] != "leases" and e["verb"] == "get")
    second.terminate()
    assert second.wait(30) == 0
    log = open(second.log_path).read()
    print(f"queue dropped at 0 s; first controller killed at {killed - dropped:.1f} s; the second acted from "
          f"{took_over - dropped:.1f} s; scale-down at {down - dropped:.1f} s (window {window} s)")
    assert "resumed policy state" in log
    assert took_over - dropped < window - 5  # it was running well inside the window...
    assert down - dropped >= window - 1.5  # ...and still waited for the window the first one began
    assert down - dropped <= window + 4
    assert history(cluster) == [1, 4, 1]  # no flap


def leader_pod(cluster) -> str:
    lease = cluster.get("coordination.k8s.io/v1", "Lease", SYSTEM_NS, "slopilot-controller")
    holder = lease["spec"]["holderIdentity"]
    wins = [e["pod"] for e in cluster.controller_requests()
            if e["resource"] == "leases" and e["verb"] in ("create", "update") and e["code"] in (200, 201)]
    assert wins, "nobody acquired the lease"
    return wins[-1] if holder else ""


def run_failover(cluster, metrics_page, timings: tuple[str, ...], lease: float, retry: float) -> None:
    page = setup(cluster, metrics_page, waiting=4)  # 2 replicas
    args = ("--namespace", "t", "--scrape-interval", "0.5", *timings)
    procs = {"ctl-a": cluster.controller_process(*args, pod="ctl-a")}
    wait_for(lambda: replicas(cluster) == 2, 30, "scale-up to 2")
    procs["ctl-b"] = cluster.controller_process(*args, pod="ctl-b")
    wait_for(lambda: any(e["pod"] == "ctl-b" and e["resource"] == "leases" for e in cluster.api.audit), 30,
             "the second replica trying the lease")
    page.waiting = 6  # more writes while both run: 3 replicas
    wait_for(lambda: replicas(cluster) == 3, 30, "scale-up to 3")
    time.sleep(2 * retry + 1)
    leader = leader_pod(cluster)
    follower = next(p for p in procs if p != leader)
    assert leader == "ctl-a"

    # exactly one writes: the follower only reads the lease and watches
    mine = [e for e in cluster.controller_requests() if e["pod"] == follower]
    used = {(e["verb"], e["resource"], e["subresource"]) for e in mine}
    print(f"follower {follower}'s requests:", sorted(used))
    assert used <= {("get", "leases", ""), ("list", "inferenceautoscalers", ""),
                    ("watch", "inferenceautoscalers", ""), ("list", "scaledobjects", ""),
                    ("watch", "scaledobjects", ""), ("list", "horizontalpodautoscalers", ""),
                    ("watch", "horizontalpodautoscalers", "")}
    leader_writes = {(e["verb"], e["resource"], e["subresource"]) for e in cluster.controller_requests()
                     if e["pod"] == leader and e["verb"] in WRITES}
    assert {("update", "deployments", "scale"), ("update", "inferenceautoscalers", "status"),
            ("create", "events", "")} <= leader_writes

    # the leader dies: the follower takes over within a lease duration and a retry period
    killed = kill(procs[leader])
    wait_for(lambda: leader_pod(cluster) == follower, lease + 10 * retry + 5, "the follower taking over")
    acquired = next(e["time"] for e in cluster.controller_requests()
                    if e["pod"] == follower and e["resource"] == "leases" and e["verb"] in ("update",
                                                                                            "create")
                    and e["code"] in (200, 201) and e["time"] > killed)
    print(f"leader killed; lease taken over {acquired - killed:.2f} s later (bound {lease + retry:g} s: "
          f"lease {lease:g} s + retry {retry:g} s)")
    assert acquired - killed <= lease + retry + 0.3  # (0.3 s: the requests themselves, on a busy machine)
    early = [e for e in cluster.controller_requests() if e["pod"] == follower and e["verb"] in WRITES
             and e["resource"] != "leases" and e["time"] < acquired]
    assert not early
    page.waiting = 8  # the new leader acts: 4 replicas
    wait_for(lambda: replicas(cluster) == 4, 30, "the new leader scaling")
    assert any(e["pod"] == follower and (e["verb"], e["resource"], e["subresource"]) ==
               ("update", "deployments", "scale") for e in cluster.controller_requests())
    procs[follower].terminate()
    assert procs[follower].wait(30) == 0
    # it released the lease on the way out
    assert cluster.get("coordination.k8s.io/v1", "Lease", SYSTEM_NS, "slopilot-controller")["spec"][
        "holderIdentity"] == ""


def test_two_replicas_one_writes_and_a_killed_leader_is_replaced(cluster, metrics_page):
    run_failover(cluster, metrics_page, FAST, lease=4.0, retry=0.5)


@pytest.mark.slow
def test_failover_with_controller_runtimes_timings(cluster, metrics_page):
    run_failover(cluster, metrics_page, (), lease=15.0, retry=2.0)
