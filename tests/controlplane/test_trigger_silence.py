"""Issue 33, live: a trigger whose query matches nothing N polls in a row is said by name, with the
label values that do exist (a "did you mean"), once; its first sample after that is said at info.
The fleet of the issue: engines label `model_name="llama2-70b"`, the trigger filters on "llama-70b"."""

from __future__ import annotations

import logging

import httpx
import pytest

from autoscaler import load_spec, make_policy
from controlplane.controller import AutoscalerLoop
from controlplane.settings import ControllerArgs
from controlplane.sources.scrape import ScrapeSource
from controlplane.targets import MemoryTarget
from controlplane.trigger_silence import TriggerSilence, query_hint

PAGE = ('vllm:num_requests_waiting{model_name="llama2-70b"} 7700\n'
        'vllm:num_requests_running{model_name="llama2-70b"} 64\n')


def spec(query: str):
    return load_spec(f"""
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: llama}}
spec:
  scaleTargetRef: {{name: llama-70b}}
  minReplicaCount: 1
  maxReplicaCount: 10
  triggers:
    - type: prometheus
      name: queue
      metadata: {{query: '{query}', threshold: "5"}}
""")


class Clock:
    t = 1000.0

    def __call__(self) -> float:
        return self.t


def loop_for(query: str, pages: dict, polls: int = 3):
    clock = Clock()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=pages["page"])

    source = ScrapeSource(["http://e1:8000"], clock=clock, transport=httpx.MockTransport(handler))
    s = spec(query)
    lp = AutoscalerLoop(s, make_policy(s), source, MemoryTarget(2))
    lp.silence.polls = polls
    return lp, clock


def tick(lp, clock, n: int) -> None:
    for _ in range(n):
        clock.t += 15
        lp.source.scrape()
        lp.tick(clock.t)


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "matched nothing" in
            r.getMessage()]


def test_a_label_typo_is_said_once_after_n_polls_with_did_you_mean(caplog):
    pages = {"page": PAGE}
    lp, clock = loop_for('sum(vllm:num_requests_waiting{model_name="llama-70b"})', pages)
    with caplog.at_level(logging.INFO, logger="slopilot.control"):
        tick(lp, clock, 2)
        assert warnings(caplog) == []  # two empty polls: not yet
        tick(lp, clock, 5)
    said = warnings(caplog)
    assert len(said) == 1, said  # once, not every poll
    assert "llama: trigger 'queue' matched nothing for 3 polls in a row" in said[0]
    assert 'model_name="llama2-70b"' in said[0] and 'did you mean model_name="llama2-70b"?' in said[0]
    assert lp.silence.silent() == ["queue"]
    assert lp.last_step.desired == 1  # KEDA read the empty answer as 0: the fleet went to its minimum


def test_a_misspelled_metric_name_is_said_once_by_the_scrape_source(caplog):
    """Scraping, a metric on no page is the source's error (it knows every page), said once; the
    silence watch does not say it a second time."""
    lp, clock = loop_for("sum(vllm:num_request_waiting)", {"page": PAGE})
    with caplog.at_level(logging.WARNING, logger="slopilot.control"):
        tick(lp, clock, 4)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "'vllm:num_request_waiting' is not on the 1 scraped page(s)" in said[0], said
    assert warnings(caplog) == []


def test_the_hint_names_the_close_metric():
    class Source:
        def query(self, text):
            return [((("__name__", "vllm:num_requests_waiting"), ("model_name", "m")), 1.0)] \
                if text == "vllm:num_requests_waiting" else []

    hint = query_hint("sum(vllm:num_request_waiting)", Source())
    assert hint.startswith("no series is named vllm:num_request_waiting"), hint


def test_recovery_is_said_and_a_new_silence_is_said_again(caplog):
    pages = {"page": PAGE}
    lp, clock = loop_for('sum(vllm:num_requests_waiting{model_name="llama2-70b", zone="b"})', pages)
    with caplog.at_level(logging.INFO, logger="slopilot.control"):
        tick(lp, clock, 3)
        pages["page"] = PAGE.replace('"llama2-70b"}', '"llama2-70b", zone="b"}')
        tick(lp, clock, 1)
        pages["page"] = PAGE
        tick(lp, clock, 3)
    infos = [r.getMessage() for r in caplog.records if "matches again" in r.getMessage()]
    assert infos == ["llama: trigger 'queue' matches again after 3 empty polls"]
    assert len(warnings(caplog)) == 2


def test_a_failed_query_is_not_an_empty_match(caplog):
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)

    source = ScrapeSource(["http://e1:8000"], transport=httpx.MockTransport(refuse))
    s = spec("sum(vllm:num_requests_waiting)")
    lp = AutoscalerLoop(s, make_policy(s), source, MemoryTarget(2))
    lp.silence.polls = 1
    with caplog.at_level(logging.WARNING, logger="slopilot.control"):
        for k in range(3):
            lp.tick(1000.0 + 15 * k)
    assert warnings(caplog) == []  # the source health says the source is down, not this


def test_the_setting_is_checked_and_reaches_the_loop():
    with pytest.raises(ValueError, match="--silent-polls: must be >= 1"):
        ControllerArgs(silent_polls=0)
    with pytest.raises(ValueError, match="must be >= 1"):
        TriggerSilence("x", [], 0)
    from controlplane.assemble import build_loop

    s = spec("sum(vllm:num_requests_waiting)")
    lp = build_loop(s, ControllerArgs(silent_polls=4), lambda sp: MemoryTarget(1),
                    lambda sp, t: ScrapeSource(["http://e1:8000"], transport=httpx.MockTransport(
                        lambda r: httpx.Response(200, text=PAGE))))
    assert lp.silence.polls == 4
