"""Emulated replicas: the step shape and timing, no torch, client-side latency as the latency model
predicts for the same batches, and the SIGTERM drain of a `slopilot serve` process."""

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from engine.args import EngineArgs
from engine.core.batch_shape import batch_shape
from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.emulated import EmulatedRunner, VirtualClock
from engine.llm_engine import LLMEngine
from engine.server import BackgroundServer, build_engine, build_server
from simulator.latency import load_latency_model
from tests import server_helpers

ROOT = Path(__file__).resolve().parents[2]
H100 = "h100-llama2-70b-tp4"


def test_step_shapes_of_a_chunked_run():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=10)
    seqs = [Sequence(list(range(n)), SamplingParams(max_tokens=3), str(i)) for i, n in enumerate([6, 9, 2])]
    for s in seqs:
        sched.add(s)
    shapes = []
    while sched.has_unfinished():  # chunked prefills, then mixed and decode steps
        out = sched.schedule()
        b = batch_shape(out.seqs, out.num_new_tokens)
        mine = (b.prefill_tokens, b.prefill_context, b.decode_seqs, b.decode_context, b.prefill_seqs)
        shapes.append(mine)
        sched.update(out, [7 if s.num_computed_tokens + n == len(s) else None
                           for s, n in zip(out.seqs, out.num_new_tokens)])
    assert shapes[0] == (10, 10, 0, 0, 2)  # 6 tokens of seq 0, a 4-token chunk of seq 1
    assert any(s[2] > 0 and s[0] > 0 for s in shapes)  # a mixed step
    assert shapes[-1][0] == 0 and shapes[-1][2] >= 1  # ends decoding


def test_runner_sleeps_what_the_model_predicts():
    latency = load_latency_model(H100)
    clock = VirtualClock()
    runner = EmulatedRunner(latency, num_kv_blocks=256, sleep=clock.sleep, clock=clock)
    engine = LLMEngine(EngineArgs("emu"), runner=runner, clock=clock)
    runner.log_steps = True
    engine.add_request("x" * 99, SamplingParams(max_tokens=4))
    engine.add_request("y" * 49, SamplingParams(max_tokens=4))
    while engine.has_unfinished():
        engine.step()
    assert runner.steps[0][0] == (150, 150, 0, 0, 2)
    assert runner.steps[1][0] == (0, 0, 2, 152, 0)
    expected = sum(latency.step_ms(*shape) for shape, _ in runner.steps) / 1000
    assert clock.now == pytest.approx(expected)
    assert [ms for _, ms in runner.steps] == [latency.step_ms(*s) for s, _ in runner.steps]
    text = engine.tokenizer.decode(engine.pop_output(next(iter(engine.seqs))).token_ids)
    assert text == "lore"


def test_emulated_server_imports_no_torch():
    code = ("import sys\n"
            "import slopilot.commands.serve\n"
            "from engine.server import build_engine, build_server\n"
            "from simulator.latency import load_latency_model\n"
            f"e, n = build_engine(latency=load_latency_model({H100!r}))\n"
            "build_server(e, n)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "print('no torch')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "no torch" in out.stdout


def test_simulator_never_imports_the_server_or_the_emulator():
    for path in (ROOT / "simulator").rglob("*.py"):
        text = path.read_text()
        for banned in ("engine.server", "engine.emulated", "slopilot.commands.serve"):
            assert banned not in text, f"{path} mentions {banned}"


def test_client_side_ttft_and_itl_match_the_latency_model():
    """8 streams arrive while a long prefill runs, so they share batches that a virtual-time replay
    of the same engine reproduces; the client's TTFT and ITL must be within 10% of the replay's."""
    engine, name = build_engine(EngineArgs(max_model_len=4096), load_latency_model(H100))
    rng = random.Random(0)
    prompts = ["".join(rng.choice("abcdefghij") for _ in range(120)) for _ in range(8)]
    blocker, max_tokens = "b" * 1999, 16

    async def load(url: str):
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as c:
            await c.completions.create(model=name, prompt="warm up", max_tokens=2)

            async def one(prompt: str):
                sent = time.perf_counter()
                stream = await c.completions.create(model=name, prompt=prompt, max_tokens=max_tokens,
                                                    stream=True, extra_body={"ignore_eos": True})
                times = [time.perf_counter() async for ch in stream if ch.choices and ch.choices[0].text]
                return sent, times

            t0 = time.perf_counter()
            first = asyncio.ensure_future(c.completions.create(model=name, prompt=blocker, max_tokens=1))
            await asyncio.sleep(0.05)
            results = await asyncio.gather(*(one(p) for p in prompts))
            await first
            return t0, results

    with BackgroundServer(build_server(engine, name)) as s:
        t0, results = asyncio.run(load(s.url))
    assert max(sent for sent, _ in results) - t0 < 0.15  # all arrived during the blocker's prefill
    assert all(len(times) == max_tokens for _, times in results)

    # the same load in virtual time: what the latency model predicts for these batches
    clock = VirtualClock()
    runner = EmulatedRunner(load_latency_model(H100), num_kv_blocks=engine.block_manager.num_blocks,
                            max_model_len=4096, sleep=clock.sleep, clock=clock)
    replay = LLMEngine(EngineArgs(name), runner=runner, clock=clock)
    replay.add_request(blocker, SamplingParams(max_tokens=1), "blocker", 0.0)
    replay.step()
    token_times: dict[str, list[float]] = {}
    for i, (sent, _) in enumerate(results):
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        replay.add_request(prompts[i], params, str(i), sent - t0)
    while replay.has_unfinished():
        for seq in replay.step():
            token_times.setdefault(seq.request_id, []).append(clock.now)

    def mean(xs):
        return sum(xs) / len(xs)

    ttft_measured = mean([times[0] - sent for sent, times in results])
    ttft_predicted = mean([token_times[str(i)][0] - (sent - t0) for i, (sent, _) in enumerate(results)])
    itl_measured = mean([(times[-1] - times[0]) / (len(times) - 1) for _, times in results])
    itl_predicted = mean([(t[-1] - t[0]) / (len(t) - 1) for t in token_times.values()])
    report = (f"TTFT {ttft_measured * 1e3:.1f} ms vs {ttft_predicted * 1e3:.1f} ms predicted; "
              f"ITL {itl_measured * 1e3:.2f} ms vs {itl_predicted * 1e3:.2f} ms predicted")
    print(report)
    assert ttft_measured == pytest.approx(ttft_predicted, rel=0.10), report
    assert itl_measured == pytest.approx(itl_predicted, rel=0.10), report


def start_serve(*extra: str):
    return server_helpers.start_serve("--emulate", H100, *extra)


def stream_events(r: httpx.Response):
    for line in r.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: "):]


@pytest.mark.parametrize("drain_timeout, max_tokens", [(10.0, 40), (0.5, 400)])
def test_sigterm_drains_then_exits(drain_timeout, max_tokens):
    """Exit 0 when the drain finished every request; else the cut request's stream ends with a 503
    error event and the exit code says the drain was incomplete."""
    from engine.server.defaults import EXIT_DRAIN_INCOMPLETE

    proc, url = start_serve("--drain-timeout", str(drain_timeout))
    try:
        texts, done, errors = [], False, []
        with httpx.stream("POST", url + "/v1/completions", timeout=30,
                          json={"prompt": "hi", "max_tokens": max_tokens, "stream": True}) as r:
            events = stream_events(r)
            texts.append(json.loads(next(events))["choices"][0]["text"])
            t_term = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            with pytest.raises(httpx.ConnectError):  # no longer accepting
                httpx.get(url + "/health")
            try:
                for data in events:
                    if data == "[DONE]":
                        done = True
                        break
                    obj = json.loads(data)
                    if "error" in obj:
                        errors.append(obj["error"])
                    else:
                        texts.append(obj["choices"][0]["text"])
            except httpx.HTTPError as exc:  # pragma: no cover - reported by the asserts below
                errors.append(repr(exc))
        code = proc.wait(20)
        elapsed = time.monotonic() - t_term
    finally:
        if proc.poll() is None:
            proc.kill()
    assert done  # either way the stream ends properly
    if max_tokens == 40:  # finishes well within the drain timeout: the whole answer arrives
        assert code == 0 and len(texts) == 40 and not errors
    else:  # 400 tokens take ~12 s: cut at the 0.5 s drain timeout with a final error event
        assert code == EXIT_DRAIN_INCOMPLETE and len(texts) < 100
        assert len(errors) == 1 and errors[0]["code"] == 503 and "drain timeout" in errors[0]["message"]
        assert elapsed < 8


@pytest.mark.parametrize("argv, message", [
    (["--emulate", "nope.json"], "nope.json"),
    (["--emulate", H100, "--max-num-seqs", "0"], "--max-num-seqs"),
    (["--emulate", H100, "--drain-timeout", "-1"], "--drain-timeout"),
    (["--emulate", H100, "--health-hold", "-1"], "--health-hold"),
    (["--emulate", H100, "--startup-delay", "-1"], "--health-hold"),  # the old name still parses
])
def test_serve_cli_rejects_bad_options(argv, message):
    import argparse

    from slopilot.commands import serve as cli_serve

    parser = argparse.ArgumentParser()
    cli_serve.add_arguments(parser)
    with pytest.raises(ValueError, match=message):
        cli_serve.run(parser.parse_args(argv))
