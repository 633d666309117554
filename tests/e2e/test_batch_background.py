"""Batch lines sent with the engine's background priority (route --batch-engine-priority) yield every
step to an interactive request on an engine run with --background-priority: no batch line finishes
while an interactive stream runs, and the batch completes after it. The same on an engine without
the flag (fcfs) shows the lines finishing beside the stream, so the test tells the two apart; with
--background-step-budget the lines' decodes join the stream's steps, so some finish during it."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.e2e.test_batch_api import FLOW, MODEL, line, upload, wait_done
from tests.e2e.test_router_openai import start_router

BACKGROUND = ("--scheduling-policy", "priority", "--background-priority", "1")
BOUNDED = (*BACKGROUND, "--background-step-budget", "3", "--background-solo-step", "70")


@pytest.mark.parametrize("engine_args", [BACKGROUND, (), BOUNDED], ids=["background", "fcfs", "bounded"])
def test_batch_lines_yield_to_an_interactive_stream(emulated_servers, tmp_path, engine_args):
    urls = emulated_servers(1, "--max-num-seqs", "16", *engine_args)
    with start_router(urls, FLOW, state_dir=str(tmp_path), batch_inflight=16,
                      batch_engine_priority=1) as router:
        c = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
        rows = [line(i, i % 2 == 0, max_tokens=16, ignore_eos=True) for i in range(60)]
        b = c.batches.create(input_file_id=upload(c, rows), endpoint="/v1/completions",
                             completion_window="1h")
        deadline = time.monotonic() + 30
        while c.batches.retrieve(b.id).request_counts.completed < 2:  # lines are flowing
            assert time.monotonic() < deadline
            time.sleep(0.05)
        counts, chunks = [], 0
        body = {"model": MODEL, "prompt": "an interactive question", "max_tokens": 100, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", router.url + "/v1/completions", json=body, trust_env=False, timeout=60,
                          headers={"x-slopilot-priority": "interactive"}) as r:
            assert r.status_code == 200
            for s in r.iter_lines():
                if s.startswith("data: {"):
                    chunks += 1
                    if chunks in (1, 20, 100):  # from well after it started (the lines out then are paused)
                        counts.append(c.batches.retrieve(b.id).request_counts.completed)
        assert chunks == 100
        done = wait_done(c, b.id)
        assert done.status == "completed" and done.request_counts.completed == 60
        print(f"{engine_args or 'fcfs'}: batch lines completed at chunk 1 / 20 / 100 of the stream: {counts}")
        if engine_args == BACKGROUND:
            assert counts[2] == counts[1]  # none finished while the interactive request ran
        elif engine_args == BOUNDED:
            # the lines out decode beside the stream (within 3 ms a step) and finish; the next ones
            # wait, as a prefill's fixed cost does not fit a decode step's budget
            assert counts[1] > counts[0] and counts[2] == counts[1]
        else:
            assert counts[2] >= counts[1] + 5  # fcfs: they share its steps
