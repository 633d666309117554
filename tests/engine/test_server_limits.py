"""Bounded by default and well behaved at the edges: the body-size limit (413), the waiting-queue
bound (429), /health while a huge prompt is tokenized, one log line for a client that leaves,
503s and the exit code when the SIGTERM drain runs out, the API key (constant time, /metrics
optional), and the `serve` command line (positional model, --version, defaults in --help)."""

import argparse
import asyncio
import contextlib
import hmac
import json
import logging
import signal
import threading
import time

import httpx
import pytest

from engine.args import EngineArgs, from_cli
from engine.model.tokenizer import ByteTokenizer
from engine.server import BackgroundServer, build_engine, build_server, defaults
from engine.server.app import INLINE_TOKENIZE_MAX
from simulator.latency import load_latency_model
from slopilot import cli
from tests.server_helpers import (
    CHAT,
    CMPL,
    assert_error,
    idle,
    metric,
    start_probe,
    start_serve,
    stop_probe,
    wait_for,
)

H100 = "h100-llama2-70b-tp4"  # steps of 30-50 ms: requests stay in flight long enough to catch


def emulated(model: str = "cpu-tiny", engine_args: EngineArgs | None = None, **server) -> BackgroundServer:
    engine, name = build_engine(engine_args or EngineArgs(max_model_len=1024), load_latency_model(model))
    s = BackgroundServer(build_server(engine, name, **server))
    s.model = name
    return s


# -- request body size ------------------------------------------------------------------------------
def body_of(size: int, path: str = CMPL) -> bytes:
    """A valid request of exactly `size` bytes (padded inside the prompt)."""
    head = {"prompt": ""} if path == CMPL else {"messages": [{"role": "user", "content": ""}]}
    empty = len(json.dumps({**head, "max_tokens": 1}))
    pad = "p" * (size - empty)
    full = {"prompt": pad} if path == CMPL else {"messages": [{"role": "user", "content": pad}]}
    body = json.dumps({**full, "max_tokens": 1}).encode()
    assert len(body) == size
    return body


def chunked(body: bytes, piece: int = 300):
    for i in range(0, len(body), piece):  # a generator: httpx sends it chunked, with no length
        yield body[i:i + piece]


@pytest.mark.parametrize("path", [CMPL, CHAT])
def test_body_over_the_limit_is_413(path):
    limit = 900
    with emulated(max_request_bytes=limit) as s:
        headers = {"content-type": "application/json"}
        for size, status in [(limit - 1, 200), (limit, 200), (limit + 1, 413), (10 * limit, 413)]:
            for content in (body_of(size, path), chunked(body_of(size, path))):
                r = httpx.post(s.url + path, content=content, headers=headers)
                if status == 413:
                    err = assert_error(r, 413)
                    assert err["type"] == "RequestTooLargeError" and str(limit) in err["message"]
                else:
                    assert r.status_code == 200, r.text
        assert httpx.get(s.url + "/health").status_code == 200


def test_default_body_limit_refuses_100_mb_unread():
    with emulated() as s:
        big = b"x" * (100 * 1024 * 1024)
        t0 = time.monotonic()
        r = httpx.post(s.url + CMPL, content=big, headers={"content-type": "application/json"}, timeout=60)
        assert_error(r, 413)
        assert str(defaults.MAX_REQUEST_BYTES) in r.json()["error"]["message"]
        assert time.monotonic() - t0 < 10
        ok = httpx.post(s.url + CMPL, content=body_of(defaults.MAX_REQUEST_BYTES // 2),
                        headers={"content-type": "application/json"}, timeout=60)
        assert_error(ok, 400, "prompt")  # under the limit: read, parsed, and only too long for the model


# -- the waiting queue ------------------------------------------------------------------------------
def test_queue_bound_is_on_by_default():
    with emulated() as s:
        assert s.app.state.server.max_waiting == defaults.MAX_WAITING > 0


def test_burst_beyond_the_queue_bound_gets_429():
    """A burst of long prompts (tokenized off the loop, so they all overlap): at most max_num_seqs
    run and max_waiting wait; every other request gets 429 at once."""
    max_waiting, n = 3, 14
    prompt = "q" * (INLINE_TOKENIZE_MAX + 1000)
    args = EngineArgs(max_model_len=16384, max_num_seqs=1, num_kv_blocks=1024)
    with emulated(H100, args, max_waiting=max_waiting) as s:
        async def burst():
            async with httpx.AsyncClient(timeout=60) as c:
                async def one():
                    t0 = time.monotonic()
                    r = await c.post(s.url + CMPL, json={"prompt": prompt, "max_tokens": 3})
                    return r, time.monotonic() - t0
                return await asyncio.gather(*(one() for _ in range(n)))

        results = asyncio.run(burst())
        ok = [r for r, _ in results if r.status_code == 200]
        refused = [(r, dt) for r, dt in results if r.status_code == 429]
        assert len(ok) + len(refused) == n
        assert max_waiting <= len(ok) <= max_waiting + 2, [r.status_code for r, _ in results]
        for r, dt in refused:
            assert r.json()["error"]["type"] == "RateLimitError" and dt < 2.0
        assert wait_for(lambda: idle(s.url), 30)


# -- a huge prompt never stalls /health -------------------------------------------------------------
@pytest.mark.parametrize("bos, eos, vocab", [(256, 257, 512), (1, 2, 300), (0, 1, 258)])
@pytest.mark.parametrize("text", ["", "a", "é" * 40_000, "x" * 65_535 + "€" + "y" * 70_000, "😀" * 50_000])
def test_byte_tokenizer_encodes_long_text_in_chunks_exactly(bos, eos, vocab, text):
    # encoded a chunk at a time (so a thread tokenizing a huge prompt hands the interpreter over):
    # characters split across chunks still come out as their bytes, in order
    tok = ByteTokenizer(bos, eos, vocab)
    ids = tok.encode(text)
    assert ids == [bos, *(tok.offset + b for b in text.encode("utf-8"))]
    assert all(type(i) is int for i in ids) and tok.decode(ids) == text


def test_health_stays_responsive_while_huge_prompts_are_tokenized():
    proc, url = start_serve("--emulate", "cpu-tiny")  # a process of its own: only its threads share its GIL
    try:
        prompt = "h" * (defaults.MAX_REQUEST_BYTES - 1000)  # ~4 M characters: ~0.1 s to tokenize each
        probe = start_probe(int(url.rsplit(":", 1)[1]))
        time.sleep(0.3)

        def one(results: list):
            results.append(httpx.post(url + CMPL, json={"prompt": prompt, "max_tokens": 1}, timeout=60))

        results: list = []
        senders = [threading.Thread(target=one, args=(results,)) for _ in range(3)]
        for t in senders:  # a little apart: their bodies are read and parsed one after another
            t.start()
            time.sleep(0.15)
        for t in senders:
            t.join(60)
        probes, failures = stop_probe(probe)
    finally:
        proc.terminate()
        proc.wait(30)
    latencies = [x for _, x in probes]
    assert [r.status_code for r in results] == [400] * 3  # tokenized, then too long for the context
    assert all("maximum context length" in r.json()["error"]["message"] for r in results)
    # the tokenizer thread shares the interpreter with the event loop, handing it over between chunks
    # of the prompt: /health slows to tens of milliseconds (up to ~0.15 s on a shared 2-core machine
    # under load), where tokenizing in one piece on the loop would hold it for the whole prompt
    assert not failures and len(latencies) > 10 and max(latencies) < 0.25, sorted(latencies)[-5:]


# -- a client that goes away ------------------------------------------------------------------------
class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def server_logs():
    """Records of our loggers and uvicorn's, at INFO (after uvicorn configured its own)."""
    handler = Records()
    loggers = [logging.getLogger(n) for n in ("slopilot", "uvicorn.error", "uvicorn")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    try:
        yield handler.records
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(handler)
            lg.setLevel(level)


@pytest.mark.parametrize("path, stream", [(CMPL, False), (CHAT, False), (CMPL, True)])
def test_disconnect_is_one_abort_line_without_traceback(path, stream):
    server = emulated(H100, EngineArgs(max_model_len=2048))
    with server_logs() as records, server as s:
        body = ({"prompt": "y" * 100} if path == CMPL else {"messages": [{"role": "user", "content": "y"}]})
        body.update(max_tokens=500, stream=stream)
        aborts = metric(s.url, "vllm:request_success_total", finished_reason="abort")
        if stream:  # read a few events, then hang up
            with httpx.stream("POST", s.url + path, json=body) as r:
                lines = r.iter_lines()
                assert [next(lines) for _ in range(4)]
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(s.url + path, json=body, timeout=0.5)
        assert wait_for(lambda: idle(s.url))
        assert metric(s.url, "vllm:request_success_total", finished_reason="abort") == aborts + 1
        time.sleep(0.2)
    lines = [r.getMessage() for r in records]
    abort_lines = [line for line in lines if "aborted: the client disconnected" in line]
    assert len(abort_lines) == 1 and "\n" not in abort_lines[0], lines
    assert not [r for r in records if r.exc_info or r.levelno >= logging.ERROR], lines


# -- SIGTERM when the drain timeout runs out --------------------------------------------------------
def test_drain_timeout_ends_a_non_streaming_request_with_503():
    proc, url = start_serve("--emulate", H100, "--drain-timeout", "0.5")
    try:
        result: list = []
        sender = threading.Thread(target=lambda: result.append(
            httpx.post(url + CMPL, json={"prompt": "hi", "max_tokens": 400, "ignore_eos": True}, timeout=30)))
        sender.start()
        assert wait_for(lambda: metric(url, "vllm:num_requests_running") == 1)
        proc.send_signal(signal.SIGTERM)
        sender.join(20)
        code = proc.wait(20)
        output = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    err = assert_error(result[0], 503)
    assert err["type"] == "ServiceUnavailableError" and "drain timeout" in err["message"]
    assert code == defaults.EXIT_DRAIN_INCOMPLETE, output
    assert "1 requests still running were ended with 503" in output
    assert "Traceback" not in output


# -- the API key ------------------------------------------------------------------------------------
def test_api_key_is_compared_in_constant_time(monkeypatch):
    calls = []
    real_compare = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    with emulated(api_key="sekrit-key") as s:
        body = {"prompt": "hi", "max_tokens": 1}
        for wrong in ["sekrit-kez", "sekrit-ke", "sekrit-key2", "SEKRIT-KEY", "x", "sekrit-key-sekrit-key"]:
            assert_error(httpx.post(s.url + CMPL, json=body, headers={"Authorization": f"Bearer {wrong}"}),
                         401)
        assert_error(httpx.post(s.url + CMPL, json=body, headers={"Authorization": "sekrit-key"}), 401)
        ok = httpx.post(s.url + CMPL, json=body, headers={"Authorization": "Bearer sekrit-key"})
        assert ok.status_code == 200
    assert len(calls) == 8 and all(b == b"Bearer sekrit-key" for _, b in calls)


@pytest.mark.parametrize("protect", [False, True])
def test_metrics_key_is_a_choice(protect):
    with emulated(api_key="k", protect_metrics=protect) as s:
        assert httpx.get(s.url + "/metrics").status_code == (401 if protect else 200)
        assert httpx.get(s.url + "/metrics", headers={"Authorization": "Bearer k"}).status_code == 200
        assert httpx.get(s.url + "/health").status_code == 200  # probes never need the key
        assert httpx.get(s.url + "/v1/models").status_code == 401


# -- the command line -------------------------------------------------------------------------------
def serve_parser() -> argparse.ArgumentParser:
    from slopilot.commands import serve as cli_serve

    parser = argparse.ArgumentParser(prog="slopilot serve")
    cli_serve.add_arguments(parser)
    return parser


def test_model_may_be_positional():
    args = serve_parser().parse_args(["tiny", "--max-num-seqs", "4"])
    assert from_cli(args, model=args.model or args.model_tag).model == "tiny"
    assert serve_parser().parse_args(["--model", "tiny"]).model == "tiny"
    for argv in (["tiny", "--model", "tiny"], ["tiny", "--emulate", H100], []):
        with pytest.raises(SystemExit):
            serve_parser().parse_args(argv)


def test_version_and_help_show_defaults(capsys):
    with pytest.raises(SystemExit):
        serve_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"slopilot {defaults.version()}"
    text = " ".join(serve_parser().format_help().split())
    for expected in (f"(default: {defaults.MAX_WAITING})", f"(default: {defaults.MAX_REQUEST_BYTES})",
                     f"(default: {defaults.DRAIN_TIMEOUT_S})", "(default: 127.0.0.1)", "0.0.0.0",
                     "--protect-metrics", "(default: 8000)", "(default: info)"):
        assert expected in text, expected


def test_every_serve_and_engine_flag_has_help_and_a_default_shown():
    parser = serve_parser()
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or action.dest == "help":
            continue
        assert action.help, action.option_strings
        shown = " ".join(parser._get_formatter()._format_action(action).split())
        # shown by the formatter, or worded in the help (a default of None has no value to show)
        if action.dest != "version" and action.default is not None and "default" not in action.help:
            assert f"(default: {action.default})" in shown, shown
    text = " ".join(parser.format_help().split())
    for expected in ("--max-num-seqs MAX_NUM_SEQS most requests in a batch (default: 64)",
                     "turn off prefix caching (on by default)", "(default: the model's limit)",
                     "(real mode only) (default: cpu)"):
        assert expected in text, expected


@pytest.mark.parametrize("argv", [["--version"], *([c, "--help"] for c in sorted(cli._available()))],
                         ids=lambda argv: " ".join(argv))
def test_top_level_version_and_each_subcommand_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    if argv == ["--version"]:
        assert out.strip() == f"slopilot {defaults.version()}"
    else:
        assert out.startswith(f"usage: slopilot {argv[0]}") and "-h, --help" in out


@pytest.mark.parametrize("argv, message", [
    (["--emulate", H100, "--max-waiting", "-1"], "--max-waiting"),
    (["--emulate", H100, "--max-request-bytes", "0"], "--max-request-bytes"),
])
def test_serve_rejects_bad_limits(argv, message):
    from slopilot.commands import serve as cli_serve

    with pytest.raises(ValueError, match=message):
        cli_serve.run(serve_parser().parse_args(argv))
