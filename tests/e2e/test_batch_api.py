"""The Batch API on the router with the official `openai` client, in front of emulated engines: files
and batches calls unchanged, mixed completions and chat lines, invalid lines answered in the error file
with their reason, OpenAI-style errors, pagination, cancel, expiry, earliest deadline first, metrics."""

from __future__ import annotations

import io
import json
import time

import httpx
import openai
import pytest

from controlplane.router.discovery import static
from tests.e2e.test_router_openai import start_router

MODEL = "llama2-70b"  # the emulated engine's model name
TERMINAL = ("completed", "failed", "expired", "cancelled")


def line(i: int, chat: bool, max_tokens: int = 3, **body) -> dict:
    if chat:
        b = {"model": MODEL, "messages": [{"role": "user", "content": f"question {i}"}],
             "max_tokens": max_tokens}
    else:
        b = {"model": MODEL, "prompt": f"prompt number {i}", "max_tokens": max_tokens}
    return {"custom_id": f"req-{i}", "method": "POST",
            "url": "/v1/chat/completions" if chat else "/v1/completions", "body": {**b, **body}}


def upload(client: openai.OpenAI, rows: list) -> str:
    text = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"
    return client.files.create(file=("input.jsonl", io.BytesIO(text.encode())), purpose="batch").id


def wait_done(client: openai.OpenAI, batch_id: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        b = client.batches.retrieve(batch_id)
        if b.status in TERMINAL:
            return b
        assert time.monotonic() < deadline, f"batch still {b.status} after {timeout:g}s: {b.request_counts}"
        time.sleep(0.1)


def jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(s) for s in client.files.content(file_id).text.splitlines()]


def test_openai_client_runs_a_mixed_batch_with_invalid_lines(emulated_servers, tmp_path):
    urls = emulated_servers(1)
    with start_router(urls, state_dir=str(tmp_path)) as router:
        c = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
        rows: list = [line(i, chat=i % 3 == 0) for i in range(60)]
        rows += ["{not json",  # 61
                 {"method": "POST", "url": "/v1/completions", "body": {"model": MODEL, "prompt": "x"}},  # 62
                 {**line(0, False), "custom_id": "req-0"},  # 63: repeated custom_id
                 {**line(70, False), "url": "/v1/embeddings"},  # 64
                 line(71, False, max_tokens=-1)]  # 65: the engine's 400
        fid = upload(c, rows)
        f = c.files.retrieve(fid)
        assert (f.purpose, f.filename, f.object) == ("batch", "input.jsonl", "file") and f.bytes > 0
        b = c.batches.create(input_file_id=fid, endpoint="/v1/completions", completion_window="24h",
                             metadata={"job": "nightly"})
        assert b.status == "validating" and b.metadata == {"job": "nightly"}
        b = wait_done(c, b.id)
        assert b.status == "completed" and b.completed_at >= b.in_progress_at >= b.created_at
        assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (65, 60, 5)
        assert b.usage.output_tokens == 60 * 3 and b.usage.input_tokens > 0
        assert sorted(e.line for e in b.errors.data) == [61, 62, 63, 64]
        out, err = jsonl(c, b.output_file_id), jsonl(c, b.error_file_id)
        assert sorted(o["custom_id"] for o in out) == sorted(f"req-{i}" for i in range(60))  # each once
        for o in out:
            assert o["response"]["status_code"] == 200 and o["error"] is None
            assert o["id"].startswith("batch_req_")
            chat = int(o["custom_id"].split("-")[1]) % 3 == 0
            assert o["response"]["body"]["object"] == ("chat.completion" if chat else "text_completion")
            assert o["response"]["body"]["usage"]["completion_tokens"] == 3
        reasons = {e["custom_id"]: (e["error"] or {}).get("code") for e in err}
        assert len(err) == 5 and reasons[None] in ("invalid_json_line", "missing_required_parameter")
        codes = sorted(str((e["error"] or {}).get("code")) for e in err)
        assert codes == ["None", "duplicate_custom_id", "invalid_json_line", "invalid_request",
                         "missing_required_parameter"]
        engine_400 = next(e for e in err if e["custom_id"] == "req-71")
        assert engine_400["response"]["status_code"] == 400 and "max_tokens" in json.dumps(engine_400)
        assert all("line " in e["error"]["message"] for e in err if e["error"])  # the reason names the line
        text = httpx.get(router.url + "/metrics", trust_env=False).text
        assert 'slopilot_batch_lines_total{outcome="completed"} 60.0' in text
        assert "slopilot_batch_backlog_requests 0.0" in text
        # through the gate: the 60 lines and the engine's 400
        assert 'llm_d_epp_request_total{model_name="llama2-70b",priority="0"} 61.0' in text


def test_files_and_batches_calls_and_errors(emulated_servers, tmp_path):
    urls = emulated_servers(1)
    with start_router(urls, state_dir=str(tmp_path)) as router:
        c = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
        ids = [upload(c, [line(i, False)]) for i in range(3)]
        assert [f.id for f in c.files.list()] == ids[::-1]  # newest first
        assert [f.id for f in c.files.list(order="asc", limit=2)] == ids  # the pager follows `after`
        assert c.files.content(ids[0]).text == json.dumps(line(0, False)) + "\n"
        assert c.files.delete(ids[2]).deleted and len(c.files.list().data) == 2
        with pytest.raises(openai.NotFoundError):
            c.files.retrieve(ids[2])
        with pytest.raises(openai.BadRequestError) as e:
            c.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
        assert e.value.body["param"] == "purpose"
        for content, words in ((b"\xff\xfe\n", "UTF-8"), (b"\n \n", "no lines")):
            with pytest.raises(openai.BadRequestError, match=words):
                c.files.create(file=("x.jsonl", io.BytesIO(content)), purpose="batch")
        r = httpx.post(router.url + "/v1/files", json={"purpose": "batch"}, trust_env=False)
        assert r.status_code == 400 and "multipart" in r.json()["error"]["message"]
        bad = [({"input_file_id": "file-nope"}, openai.NotFoundError, "input_file_id"),
               ({"endpoint": "/v1/embeddings"}, openai.BadRequestError, "endpoint"),
               ({"completion_window": "48h"}, openai.BadRequestError, "completion_window"),
               ({"metadata": {"k": "v" * 600}}, openai.BadRequestError, "metadata")]
        for change, error, param in bad:
            kw = {"input_file_id": ids[0], "endpoint": "/v1/completions", "completion_window": "24h",
                  **change}
            with pytest.raises(error) as e:
                c.batches.create(**kw)
            assert e.value.body["param"] == param
        made = [c.batches.create(input_file_id=i, endpoint="/v1/completions", completion_window="24h").id
                for i in ids[:2] * 3]
        pages = c.batches.list(limit=4)
        assert [b.id for b in pages.data] == made[::-1][:4] and pages.has_more
        assert [b.id for b in pages.iter_pages().__next__().data] == made[::-1][:4]
        assert [b.id for b in c.batches.list(limit=4)] == made[::-1]  # iterating fetches the next page
        for b in made:
            wait_done(c, b)
        with pytest.raises(openai.ConflictError):
            c.batches.cancel(made[0])
        with pytest.raises(openai.NotFoundError):
            c.batches.retrieve("batch_nope")


def test_cancel_and_expiry_answer_the_rest(emulated_servers, tmp_path):
    """Lines still queued when a batch is cancelled (or its window passes) end in the error file as
    batch_cancelled (batch_expired); the lines already answered stay in the output file."""
    urls = emulated_servers(1)
    with start_router(urls, state_dir=str(tmp_path), batch_inflight=4) as router:
        c = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
        fid = upload(c, [line(i, False, max_tokens=60, ignore_eos=True) for i in range(60)])
        b = c.batches.create(input_file_id=fid, endpoint="/v1/completions", completion_window="24h")
        while c.batches.retrieve(b.id).request_counts.completed < 4:
            time.sleep(0.1)
        cancelling = c.batches.cancel(b.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
        b = wait_done(c, b.id)
        out, err = jsonl(c, b.output_file_id), jsonl(c, b.error_file_id)
        assert b.status == "cancelled" and len(out) + len(err) == 60 and len(out) >= 4
        assert {e["error"]["code"] for e in err} == {"batch_cancelled"}
        assert b.request_counts.completed == len(out) and b.request_counts.failed == len(err)

        fid = upload(c, [line(i, False, max_tokens=60, ignore_eos=True) for i in range(60)])
        b = c.batches.create(input_file_id=fid, endpoint="/v1/completions", completion_window="3s")
        b = wait_done(c, b.id)
        out, err = jsonl(c, b.output_file_id), jsonl(c, b.error_file_id)
        assert b.status == "expired" and b.expired_at >= b.expires_at and len(out) + len(err) == 60
        assert len(err) > 0 and {e["error"]["code"] for e in err} == {"batch_expired"}
        assert sorted(o["custom_id"] for o in out + err) == sorted(f"req-{i}" for i in range(60))


def test_earliest_deadline_first(emulated_servers, tmp_path):
    """A batch with the nearer deadline, created second, is served first."""
    urls = emulated_servers(1)
    with start_router(urls, state_dir=str(tmp_path), batch_inflight=4) as router:
        c = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
        rows = [line(i, False, max_tokens=8, ignore_eos=True) for i in range(40)]
        kw = {"endpoint": "/v1/completions"}
        late = c.batches.create(input_file_id=upload(c, rows), completion_window="24h", **kw)
        soon = c.batches.create(input_file_id=upload(c, rows), completion_window="1h", **kw)
        soon = wait_done(c, soon.id)
        late_then = c.batches.retrieve(late.id)
        assert soon.status == "completed"
        assert late_then.status == "in_progress" and late_then.request_counts.completed < 40
        outlook = late_then.model_extra["slopilot_outlook"]  # time to spare at the current rate
        assert outlook["at_risk"] is False and 80_000 < outlook["deadline_slack_seconds"] < 86_400
        assert wait_done(c, late.id).status == "completed"


def test_no_endpoint_holds_the_lines_until_one_comes(emulated_servers, tmp_path):
    """With no engine the lines wait in the gateway's batch band (metrics show the backlog and the
    deadline); when one appears they are answered."""
    urls: list[str] = []
    with start_router([], discover=lambda: list(urls), state_dir=str(tmp_path)) as router:
        c = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
        b = c.batches.create(input_file_id=upload(c, [line(i, i % 2 == 0) for i in range(10)]),
                             endpoint="/v1/completions", completion_window="1h")
        time.sleep(1.0)
        text = httpx.get(router.url + "/metrics", trust_env=False).text
        assert "slopilot_batch_backlog_requests 10.0" in text
        assert 'slopilot_batch_backlog_tokens{kind="max_output"} 30.0' in text
        left = next(float(s.split()[-1]) for s in text.splitlines()
                    if s.startswith("slopilot_batch_earliest_deadline_seconds"))
        assert 3500 < left <= 3600
        assert 'llm_d_epp_flow_control_queue_size{inference_pool="default",priority="0"} 10.0' in text
        assert c.batches.retrieve(b.id).status == "in_progress"
        urls.extend(emulated_servers(1))
        assert wait_done(c, b.id).request_counts.completed == 10


def test_requires_the_router_key(emulated_servers):
    urls = emulated_servers(1)
    with start_router(urls, discover=static(urls), api_key="k") as router:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=router.url + "/v1", api_key="wrong", max_retries=0).files.list()
        assert openai.OpenAI(base_url=router.url + "/v1", api_key="k").batches.list().data == []


FLOW = {"kind": "EndpointPickerConfig",
        "saturationDetector": {"queueDepthThreshold": 4, "kvCacheUtilThreshold": 0.9},
        "flowControl": {"priorityBands": [
            {"priority": 10, "name": "interactive", "maxRequests": 500, "ttl": "30s"},
            {"priority": 0, "name": "batch", "maxRequests": 500, "ttl": "30s", "saturation": 0.25}]},
        "dataLayer": {"refreshInterval": "50ms"}}


def test_batch_lines_go_only_under_the_band_level_and_interactive_is_not_held(emulated_servers, tmp_path):
    """The batch band at a quarter of the saturation thresholds: batch lines reach the engine only while
    nothing waits there (its waiting queue stays at about one request), while interactive requests sent
    during the batch are dispatched by the gate at once."""
    urls = emulated_servers(1, "--max-num-seqs", "8")
    with start_router(urls, FLOW, state_dir=str(tmp_path), batch_inflight=64) as router:
        c = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
        rows = [line(i, i % 2 == 0, max_tokens=8, ignore_eos=True) for i in range(96)]
        b = c.batches.create(input_file_id=upload(c, rows), endpoint="/v1/completions",
                             completion_window="1h")
        waiting, interactive = [], []  # (64 lines out at once would leave 56 waiting without the level)
        while c.batches.retrieve(b.id).request_counts.completed < 24:
            waiting.append(sum(float(s.split()[-1]) for s in httpx.get(
                urls[0] + "/metrics", trust_env=False).text.splitlines()
                if s.startswith("vllm:num_requests_waiting")))
            time.sleep(0.05)
        for i in range(10):  # while the batch runs
            t0 = time.monotonic()
            r = httpx.post(router.url + "/v1/completions", headers={"x-slopilot-priority": "interactive"},
                           json={"model": MODEL, "prompt": f"now {i}", "max_tokens": 2}, trust_env=False,
                           timeout=30)
            assert r.status_code == 200
            interactive.append(time.monotonic() - t0)
        assert wait_done(c, b.id).request_counts.completed == 96
        text = httpx.get(router.url + "/metrics", trust_env=False).text

        def sample(name: str, **labels) -> float:
            want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            return next(float(s.split()[-1]) for s in text.splitlines()
                        if s.startswith(name + "{") and s[len(name) + 1:].startswith(want))

        def mean_wait(band: str) -> float:
            labels = {"inference_pool": "default", "outcome": "Dispatched", "priority": band}
            base = "llm_d_epp_flow_control_request_queue_duration_seconds"
            return sample(base + "_sum", **labels) / sample(base + "_count", **labels)

        print(f"engine waiting while the batch ran: max {max(waiting):.0f}; gate wait: batch "
              f"{mean_wait('batch') * 1000:.0f} ms, interactive {mean_wait('interactive') * 1000:.1f} ms; "
              f"interactive e2e max {max(interactive) * 1000:.0f} ms")
        assert max(waiting) <= 2  # a quarter of the threshold of 4 (plus a scrape's lag)
        assert mean_wait("interactive") < 0.01 < mean_wait("batch")
