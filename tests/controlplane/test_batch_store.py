"""The Batch API's store and line checks, without a router: reasons for bad lines, a line answered
once however often its answer is written, finalize writing every line once, state surviving a reopen."""

from __future__ import annotations

import json

import pytest

from controlplane.batch import lifecycle
from controlplane.batch.batches_api import new_batch, window_seconds
from controlplane.batch.files_api import UploadError, check_upload
from controlplane.batch.lines import output_line, split
from controlplane.batch.store import COMPLETED, FAILED, PENDING, Store
from controlplane.router.prompt import PromptReader

GOOD = {"custom_id": "a", "method": "POST", "url": "/v1/completions",
        "body": {"model": "m", "prompt": "hello", "max_tokens": 7}}


def rows_of(*lines) -> tuple[list[tuple], list[dict]]:
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    return split(text.encode(), 100.0, PromptReader())


def test_line_checks_give_reasons():
    chat = {**GOOD, "custom_id": "b", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}
    rows, errors = rows_of(GOOD, chat, "", "[1]", "{oops", {**GOOD, "custom_id": ""}, GOOD,
                           {**GOOD, "custom_id": "c", "method": "GET"},
                           {**GOOD, "custom_id": "d", "url": "/x"},
                           {**GOOD, "custom_id": "e", "body": []},
                           {**GOOD, "custom_id": "f", "body": {"prompt": "x"}},
                           {**GOOD, "custom_id": "g", "body": {**GOOD["body"], "stream": True}})
    assert [r[4] for r in rows[:2]] == [PENDING, PENDING] and rows[0][7] == 7  # max_tokens kept
    assert rows[0][6] > 0 and rows[1][2] == "/v1/chat/completions"
    assert [e["line"] for e in errors] == [4, 5, 6, 7, 8, 9, 10, 11, 12]  # the blank line 3 is skipped
    assert [e["code"] for e in errors] == ["invalid_request", "invalid_json_line",
                                           "missing_required_parameter", "duplicate_custom_id",
                                           *["invalid_request"] * 5]
    assert [e["param"] for e in errors[4:]] == ["method", "url", "body", "body.model", "body.stream"]
    bad = [json.loads(r[5]) for r in rows if r[4] == FAILED]
    assert all(b["response"] is None and b["error"]["message"].startswith("line ") for b in bad)
    assert bad[3]["custom_id"] == "a"  # the repeated one keeps its id in the error file


def test_upload_checks():
    def body(purpose: str, content: bytes) -> tuple[str, bytes]:
        b = "XyZ"
        data = (f"--{b}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n--{b}\r\n"
                f"Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n").encode()
        data += content + f"\r\n--{b}--\r\n".encode()
        return f"multipart/form-data; boundary={b}", data

    assert check_upload(*body("batch", b"{}\n{}\r\n"), 100, 10) == ("in.jsonl", b"{}\n{}\r\n")
    for args, status, words in ((body("batch", b"x" * 101), 413, "over the limit of 100"),
                                (body("batch", b"{}\n" * 11), 400, "11 lines"),
                                (body("assistants", b"{}"), 400, "purpose"),
                                (body("batch", b"\n\xc3\n"), 400, "line 2"),
                                (("application/json", b"{}"), 400, "multipart")):
        with pytest.raises(UploadError, match=words) as e:
            check_upload(*args, 100, 10)
        assert e.value.status == status


def test_completion_window():
    assert window_seconds("24h") == 86400 and window_seconds("90s") == 90
    for bad in ("25h", "0s", "1d", 24, None):
        with pytest.raises(ValueError):
            window_seconds(bad)


def test_a_line_is_answered_once_and_survives_a_reopen(tmp_path):
    db = tmp_path / "b.sqlite3"
    store = Store(db)
    content = "\n".join(json.dumps({**GOOD, "custom_id": f"c{i}"}) for i in range(5)).encode()
    store.add_file({"id": "file-1", "purpose": "batch", "filename": "in", "bytes": len(content),
                    "created_at": 0}, content)
    doc = new_batch("file-1", "/v1/completions", "1h", 3600, None, 0)
    store.add_batch(doc)
    lifecycle.validate(store, doc, PromptReader())
    assert store.get_batch(doc["id"])["status"] == "in_progress"
    assert [r[1] for r in store.next_pending(10)] == [1, 2, 3, 4, 5]

    def counted(c, done):
        store.update_batch(doc["id"], lambda d: d["request_counts"].update(
            completed=d["request_counts"]["completed"] + len(done)), c)

    answer = [(doc["id"], 2, COMPLETED, output_line("c1", 200, "r", {"ok": 1}))]
    store.record(answer, counted)
    store.record(answer, counted)  # the same line again (sent twice): written once, counted once
    store.close()

    store = Store(db)  # as after a restart
    assert store.get_batch(doc["id"])["request_counts"] == {"total": 5, "completed": 1, "failed": 0}
    assert [r[1] for r in store.next_pending(10)] == [1, 3, 4, 5]
    for n in (1, 3, 4, 5):
        store.record([(doc["id"], n, COMPLETED, output_line(f"c{n - 1}", 200, "r", {"ok": 1}))], counted)
    lifecycle.finalizing(store, doc["id"])
    done = lifecycle.finalize(store, doc["id"], "completed")
    assert done["status"] == "completed" and done["error_file_id"] is None
    out = [json.loads(s) for s in store.file_content(done["output_file_id"]).decode().splitlines()]
    assert [o["custom_id"] for o in out] == [f"c{i}" for i in range(5)]
    assert store.get_file(done["output_file_id"])["purpose"] == "batch_output"


def test_backlog_and_deadline_metrics():
    from prometheus_client import CollectorRegistry

    from controlplane.batch.metrics import BatchMetrics

    store, now = Store(), [1000.0]
    reg = CollectorRegistry()
    metrics = BatchMetrics(reg, store, clock=lambda: now[0])
    for name, deadline, n in (("early", 1100.0, 30), ("late", 1300.0, 10)):
        doc = {**new_batch("f", "/v1/completions", "1h", 0, None, 0), "id": name, "status": "in_progress",
               "expires_at": deadline}
        store.add_batch(doc)
        store.replace_lines(name, [(i, f"c{i}", "/v1/completions", "{}", PENDING, None, 5, 7, deadline)
                                   for i in range(n)], lambda d: None)
    assert reg.get_sample_value("slopilot_batch_backlog_requests") == 40
    assert reg.get_sample_value("slopilot_batch_backlog_tokens", {"kind": "prompt"}) == 200
    assert reg.get_sample_value("slopilot_batch_backlog_tokens", {"kind": "max_output"}) == 280
    assert reg.get_sample_value("slopilot_batch_earliest_deadline_seconds") == 100
    assert reg.get_sample_value("slopilot_batch_deadline_slack_seconds") is None  # no rate yet
    metrics.answered([("early", 0, COMPLETED, "{}", ("m", 3, 4))] * 5)  # 5 lines answered now...
    now[0] += 10  # ...and none in the next 10 s: 0.5 lines/s
    # early: 100 - 10 - 30 / 0.5 = 30 s to spare; late (after early's 30): 300 - 10 - 40 / 0.5 = 210
    assert reg.get_sample_value("slopilot_batch_deadline_slack_seconds") == 30
    assert reg.get_sample_value("slopilot_batch_at_risk_batches") == 0
    now[0] += 50  # early: 40 s left, 60 s of work at 5 lines a minute (0.0833/s): at risk
    assert reg.get_sample_value("slopilot_batch_at_risk_batches") == 2
    assert reg.get_sample_value("batch_request_generation_tokens_total", {"model": "m"}) == 20
