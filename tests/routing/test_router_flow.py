"""Gateway flow control (routing.flow): bands, capacity, TTL, saturation, dispatch order."""

from dataclasses import dataclass

import pytest

from routing.flow import Band, GatewayQueue, SaturationDetector, pump


@dataclass
class R:
    id: int
    num_waiting: int = 0
    num_running: int = 0
    outstanding: int = 0
    kv_usage: float = 0.0


def test_priority_order_and_fifo_within_a_band():
    q = GatewayQueue([Band(0, name="low"), Band(10, name="high")])
    for item, prio in [("l1", 0), ("h1", 10), ("l2", 0), ("h2", 10), ("x", 5)]:
        assert q.offer(item, prio, now=0.0) is not None
    # priority 5 has no band of its own: it joins the highest band below it (low)
    assert [q.pop().item for _ in range(5)] == ["h1", "h2", "l1", "l2", "x"]
    assert q.pop() is None and len(q) == 0


def test_full_band_refuses_and_cancel_frees_a_place():
    q = GatewayQueue([Band(0, capacity=2)])
    a = q.offer("a", 0, 0.0)
    assert q.offer("b", 0, 0.0) is not None
    assert q.offer("c", 0, 0.0) is None  # full: the caller answers 429
    q.cancel(a)
    assert q.offer("c", 0, 0.0) is not None
    assert [q.pop().item, q.pop().item] == ["b", "c"]


def test_ttl_expiry_takes_only_what_outlived_it():
    q = GatewayQueue([Band(10, ttl=1.0), Band(0, ttl=5.0)])
    q.offer("h", 10, 0.0)
    q.offer("l", 0, 0.5)
    assert q.next_deadline() == 1.0
    assert [h.item for h in q.expire(1.0)] == ["h"]
    assert q.expire(5.4) == [] and q.next_deadline() == 5.5
    assert [h.item for h in q.expire(5.5)] == ["l"]
    assert len(q) == 0


@pytest.mark.parametrize("waiting,kv,room", [(0, 0.0, True), (3, 0.5, True), (4, 0.1, False),
                                              (0, 0.9, False), (9, 0.95, False)])
def test_saturation_detector(waiting, kv, room):
    d = SaturationDetector(queue_threshold=4, kv_threshold=0.9)
    assert d.has_room(R(0, num_waiting=waiting, kv_usage=kv)) is room
    assert (d.utilization(R(0, num_waiting=waiting, kv_usage=kv)) < 1.0) is room


def test_pool_saturation_is_the_least_utilised_endpoint():
    d = SaturationDetector(queue_threshold=4, kv_threshold=0.8)
    assert d.saturation([]) == 1.0  # scaled to zero reads as saturated
    assert d.saturation([R(0, num_waiting=8), R(1, num_waiting=2, kv_usage=0.2)]) == 0.5


def test_pump_dispatches_while_there_is_room_and_holds_the_rest():
    reps = [R(0, num_waiting=2), R(1, num_waiting=3)]
    d = SaturationDetector(queue_threshold=4, kv_threshold=0.9)
    q = GatewayQueue([Band(0, ttl=10.0)])
    for i in range(5):
        q.offer(i, 0, 0.0)
    sent = []

    def dispatch(held, room):
        r = min(room, key=lambda r: r.num_waiting)
        r.num_waiting += 1
        sent.append((held.item, r.id))

    assert pump(q, d, reps, dispatch, now=1.0) == []
    # room for 2 on replica 0 and 1 on replica 1; the other two stay held
    assert sent == [(0, 0), (1, 0), (2, 1)] and len(q) == 2
    assert all(r.num_waiting <= 4 for r in reps)
    reps[0].num_waiting = 0  # capacity frees: the held ones go out in order
    pump(q, d, reps, dispatch, now=2.0)
    assert [s[0] for s in sent[3:]] == [3, 4] and len(q) == 0


def test_pump_with_no_endpoints_holds_until_ttl():
    q = GatewayQueue([Band(0, ttl=2.0)])
    d = SaturationDetector()
    q.offer("r", 0, 0.0)
    assert pump(q, d, [], lambda h, room: None, now=1.0) == [] and len(q) == 1
    assert [h.item for h in pump(q, d, [], lambda h, room: None, now=2.0)] == ["r"]


def test_a_request_no_replica_with_room_serves_keeps_its_place():
    q = GatewayQueue([Band(10, name="high"), Band(0, name="low")])
    for item, prio in [("h-opt", 10), ("h-llama", 10), ("l-llama", 0), ("l-opt", 0)]:
        q.offer(item, prio, 0.0)
    reps = [R(0, num_waiting=0), R(1, num_waiting=5)]  # 0 serves llama and has room; 1 serves opt, full
    model = {0: "llama", 1: "opt"}
    sent = []

    def dispatch(held, room):
        assert [r.id for r in room] == [0]  # only what serves the request's model
        room[0].num_waiting += 1
        sent.append(held.item)

    def eligible(held, room):
        return [r for r in room if held.item.endswith(model[r.id])]

    pump(q, SaturationDetector(queue_threshold=2), reps, dispatch, 0.0, eligible)
    # the opt requests wait for replica 1 without blocking the llama ones behind them
    assert sent == ["h-llama", "l-llama"] and len(q) == 2
    reps[1].num_waiting = 0
    pump(q, SaturationDetector(queue_threshold=2), reps, lambda h, room: sent.append((h.item, room[0].id)),
         0.0, eligible)
    assert sent[2:] == [("h-opt", 1), ("l-opt", 1)] and len(q) == 0
