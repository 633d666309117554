"""Failure injection: a ready replica dies after an exponential time (the pool's MTBF).

Its requests are retried elsewhere or lost, as the scenario says; the pool is one replica short
until the repair time has passed, then the fleet starts a replacement.
"""

from __future__ import annotations

from simulator.steptime import to_ps


def failure_process(fleet, rep):
    """One replica's failure: started when it becomes ready."""
    f = rep.pool.spec.failure
    yield fleet.env.timeout(to_ps(float(fleet.rng_fail.exponential(f.mtbf))))
    if rep.state not in ("ready", "draining"):
        return
    pool = rep.pool
    was_live = rep.state == "ready"
    if rep in fleet.ready:
        fleet.ready.remove(rep)
    seqs = rep.fail()
    fleet.on_gone(rep)
    for seq in seqs:
        if f.on_failure == "retry":
            fleet.requests.retries[seq.index] += 1
            fleet.route(fleet.make_seq(seq.index))
        else:
            fleet.requests.failed(seq.index, rep.id)
    if was_live:
        pool.repairing += 1
        fleet.resize(pool)
        yield fleet.env.timeout(to_ps(float(f.repair.sample(fleet.rng_fail, 1)[0])))
        pool.repairing -= 1
        fleet.resize(pool)
