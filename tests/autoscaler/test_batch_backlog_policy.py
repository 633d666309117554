"""The model-based policy with a live batch backlog (autoscaler.batch_backlog): the batch lines taken out
of the engines' rate and length mix, capacity for the batch only when its answer rate would miss the
deadline (after a grace period), and the comparison mode that serves the backlog at arrival."""

import pytest

from autoscaler.batch_backlog import BacklogOptions, interactive, with_mix
from autoscaler.observation import Observation
from autoscaler.slo import SloTarget
from autoscaler.slo_model import SloModelPolicy
from autoscaler.spec import load_spec, make_policy
from simulator.latency import load_latency_model

MODEL = load_latency_model("h100-llama2-70b-tp4")
SLOS = [SloTarget("ttft", 90, 1.0), SloTarget("tpot", 90, 0.1)]


def obs(t, *, inter=1.0, lines=0.0, backlog=0.0, left=None, waiting=0.0) -> Observation:
    """Engines finishing `inter` interactive requests a second (600 prompt, 100 output tokens) and
    `lines` batch lines a second (64 and 16)."""
    total = inter + lines
    m = {"batch_backlog": backlog, "batch_answered": lines, "batch_prompt_tokens": 64 * lines,
         "batch_output_tokens": 16 * lines}
    if left is not None:
        m["batch_deadline"] = left
    return Observation(t, 1, metrics=m, arrival_rate=total, num_waiting=waiting,
                       mean_prompt_tokens=(600 * inter + 64 * lines) / total,
                       mean_output_tokens=(100 * inter + 16 * lines) / total)


def policy(serve="deadline", **kw) -> SloModelPolicy:
    return SloModelPolicy(SLOS, MODEL, max_replicas=8, polling_interval=5, startup_delay=10,
                          scale_down_delay=0, backlog=BacklogOptions("q", serve=serve, grace=20), **kw)


def test_batch_lines_are_taken_out_of_the_engines_rate_and_mix():
    o = interactive(obs(0, inter=2.0, lines=30.0))
    assert o.arrival_rate == pytest.approx(2.0)
    assert o.mean_prompt_tokens == pytest.approx(600) and o.mean_output_tokens == pytest.approx(100)
    # batch lines waiting at the engines are not interactive demand
    assert interactive(obs(0, lines=30.0, backlog=500, waiting=20)).num_waiting == 0
    assert interactive(obs(0, lines=30.0, backlog=5, waiting=20)).num_waiting == 15
    # nothing interactive finished: no mix rather than the batch's
    alone = interactive(obs(0, inter=0.0, lines=30.0))
    assert alone.arrival_rate == 0 and alone.mean_prompt_tokens is None


def test_a_batch_on_track_adds_nothing_one_behind_adds_capacity():
    base = policy().decide(obs(0, inter=2.0)).desired_replicas
    p = policy()
    # a fleet answering 30 lines/s from idle capacity, 3,000 left, 300 s to go: on track
    d = p.decide(obs(0, inter=2.0, lines=30.0, backlog=3000, left=300))
    assert d.desired_replicas == base and "on track" in d.reason
    d = p.decide(obs(30, inter=2.0, lines=30.0, backlog=2100, left=270))
    assert d.desired_replicas == base
    # the interactive load leaves it 2 lines/s, the deadline needs ~11: more replicas
    d = p.decide(obs(60, inter=2.0, lines=2.0, backlog=2000, left=200))
    assert d.desired_replicas > base and "behind" in d.reason, d.reason


def test_the_grace_period_waits_for_an_answer_rate():
    p = policy()
    d = p.decide(obs(0, inter=2.0, backlog=3000, left=300))  # just arrived, nothing answered yet
    assert "on track" in d.reason
    assert "behind" in p.decide(obs(25, inter=2.0, backlog=3000, left=275)).reason  # past the 20-s grace
    p.decide(obs(30, inter=2.0))  # the backlog gone: a new one gets its grace again
    assert "on track" in p.decide(obs(35, inter=2.0, backlog=10, left=300)).reason
    state = p.state_dict()
    again = policy()
    again.load_state_dict(state)
    assert again.backlog.since == 35


def test_serving_at_arrival_sizes_for_the_backlog_at_once():
    base = policy().decide(obs(0, inter=2.0)).desired_replicas
    d = policy("arrival").decide(obs(0, inter=2.0, backlog=3000, left=300))
    assert d.desired_replicas > base and "at arrival" in d.reason


def test_the_spec_names_and_their_triggers():
    spec = load_spec({"apiVersion": "slopilot.dev/v1alpha1", "kind": "InferenceAutoscaler",
                      "metadata": {"name": "b"},
                      "spec": {"scaleTargetRef": {"name": "b"}, "minReplicas": 1, "maxReplicas": 4,
                               "slo": {"ttft": {"percentile": 90, "seconds": 1}},
                               "policy": {"type": "sloModel", "sloModel": {
                                   "batchBacklogQuery": "sum(slopilot_batch_backlog_requests)",
                                   "batchDeadlineQuery": "min(slopilot_batch_earliest_deadline_seconds)",
                                   "batchServe": "arrival"}}}})
    assert {t.name: t.query for t in spec.triggers} == {
        "batch_backlog": "sum(slopilot_batch_backlog_requests)",
        "batch_deadline": "min(slopilot_batch_earliest_deadline_seconds)"}
    built = make_policy(spec, MODEL)
    assert built.backlog is not None and built.backlog.o.serve == "arrival"
    with pytest.raises(ValueError, match="batchServe"):
        BacklogOptions("q", serve="later")


def test_the_mix_read_from_the_router_replaces_the_engines():
    o = obs(0, inter=2.0, lines=30.0)
    o.metrics.update(mix_prompt_tokens=610.0, mix_output_tokens=float("nan"))
    got = with_mix(o)
    assert got.mean_prompt_tokens == 610.0 and got.mean_output_tokens == o.mean_output_tokens
    p = SloModelPolicy(SLOS, MODEL, max_replicas=8, prompt_tokens_query="q", output_tokens_query="q2",
                       backlog=BacklogOptions("b"))
    # the engines' rate is all batch lines (a new replica's series undercounts): the router's mix stands
    o = obs(0, inter=0.0, lines=30.0, backlog=500, left=300)
    o.metrics.update(mix_prompt_tokens=600.0, mix_output_tokens=100.0, arrivals=0.0)
    assert "no arrival rate" not in p.decide(o).reason
