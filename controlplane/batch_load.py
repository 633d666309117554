"""A batch in the built-in load: at a given second of the run, one JSONL file uploaded to the router's
Batch API (`POST /v1/files`, purpose batch) and one batch created from it (`POST /v1/batches` with a
completion window), then polled until it ends; beside the interactive schedule of controlplane.loadgen.

    load:
      arrivals: {piecewise: [[0, 1], [60, 6], [120, 1]]}
      batch: {at: 20, lines: 3000, prompt_tokens: 64, output_tokens: 16, completion_window: 4m}

Lines are completions of random token ids (so prompt lengths are exact and nothing is a prefix-cache
hit), `ignore_eos` so each line's output length is the one drawn, for `model` (default: the model the
router lists first).
The result says when the batch was created, its deadline and when it ended, all in seconds since the
load began, and its request counts: what a run compares with the window.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

from autoscaler.schema_parts import COUNT0, NONNEG, mapping
from autoscaler.yamlfile import Document, document
from controlplane.batch.batches_api import TERMINAL, window_seconds
from simulator.dists import Dist
from simulator.scenario_schema import DIST, dist_at

BATCH = mapping(
    {
        "at": NONNEG,  # seconds after the load began
        "lines": {"type": "integer", "minimum": 1, "maximum": 50000},
        "prompt_tokens": DIST,
        "output_tokens": DIST,
        "completion_window": {"type": "string", "pattern": "^[0-9]+[smh]$",
                              "x-message": "must be a duration such as '24h', '30m' or '90s'"},
        "seed": COUNT0,
        "model": {"type": "string", "minLength": 1},  # default: the first model the router lists
    },
    ("lines", "completion_window"),
)


def _tokens(n: int) -> Dist:
    return Dist("constant", {"value": n}, integer=True)


@dataclass
class BatchLoad:
    lines: int
    completion_window: str
    at: float = 0.0
    prompt_tokens: Dist = field(default_factory=lambda: _tokens(64))
    output_tokens: Dist = field(default_factory=lambda: _tokens(16))
    seed: int = 0
    model: str = ""

    @classmethod
    def parse(cls, source: dict | Document) -> BatchLoad:
        """From a `load.batch` mapping (its Document for errors naming file, line and field)."""
        doc = document(source)
        d = doc.data
        try:
            window_seconds(d.get("completion_window"))
        except ValueError as exc:
            raise doc.error(("completion_window",), str(exc)) from None
        spec = cls(int(d["lines"]), str(d["completion_window"]), float(d.get("at", 0.0)),
                   seed=int(d.get("seed", 0)), model=str(d.get("model", "")))
        for k in ("prompt_tokens", "output_tokens"):
            if k in d:
                dist = dist_at(doc, k, integer=True)
                setattr(spec, k, Dist(dist.kind, dist.params, max(dist.lo or 1, 1), dist.hi, True))
        return spec

    @property
    def window(self) -> float:
        return window_seconds(self.completion_window)

    def jsonl(self, model: str) -> bytes:
        """The input file: one completion a line, drawn from the seed."""
        rng = np.random.default_rng(self.seed + 7)
        prompt = self.prompt_tokens.sample(rng, self.lines).astype(int)
        output = self.output_tokens.sample(rng, self.lines).astype(int)
        rows = [json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": model, "prompt": rng.integers(3, 256, int(p)).tolist(),
                                     "max_tokens": int(o), "ignore_eos": True}}, separators=(",", ":"))
                for i, (p, o) in enumerate(zip(prompt, output))]
        return ("\n".join(rows) + "\n").encode()


class BatchSubmitter:
    """Submits one BatchLoad to `router_url` at t0 + at (t0: time.time() when the load began) and
    follows it; `result()` is what is known so far (a dict, JSON-able)."""

    def __init__(self, spec: BatchLoad, router_url: str, t0: float, poll: float = 1.0):
        self.spec, self.url, self.t0, self.poll = spec, router_url.rstrip("/"), t0, poll
        self._stop = threading.Event()
        self.finished = threading.Event()  # run() has returned: the batch ended, failed or was left
        self.state: dict = {"lines": spec.lines, "completion_window": spec.completion_window,
                            "status": "not submitted"}

    def stop(self) -> None:
        self._stop.set()

    def result(self) -> dict:
        return dict(self.state)

    def run(self) -> dict:
        try:
            return self._run()
        finally:
            self.finished.set()

    def _run(self) -> dict:
        if self._stop.wait(max(0.0, self.t0 + self.spec.at - time.time())):
            return self.result()
        with httpx.Client(timeout=60.0, trust_env=False) as c:
            try:
                self._submit(c)
            except (httpx.HTTPError, KeyError, ValueError, IndexError) as exc:
                self.state.update(status="submit failed", error=f"{type(exc).__name__}: {exc}"[:300])
                return self.result()
            while not self._stop.wait(self.poll):
                try:
                    if self._follow(c):
                        break
                except (httpx.HTTPError, ValueError) as exc:  # the router restarting: poll again
                    self.state["last_poll_error"] = f"{type(exc).__name__}: {exc}"[:200]
        return self.result()

    def _submit(self, c: httpx.Client) -> None:
        model = self.spec.model
        if not model:
            models = c.get(f"{self.url}/v1/models")
            models.raise_for_status()
            model = models.json()["data"][0]["id"]
        up = c.post(f"{self.url}/v1/files", data={"purpose": "batch"},
                    files={"file": ("load.jsonl", self.spec.jsonl(model), "application/jsonl")})
        up.raise_for_status()
        made = c.post(f"{self.url}/v1/batches", json={"input_file_id": up.json()["id"], "endpoint":
                                                      "/v1/completions",
                                                      "completion_window": self.spec.completion_window})
        made.raise_for_status()
        now = time.time() - self.t0
        self.state.update(id=made.json()["id"], status=made.json()["status"], created_s=round(now, 3),
                          deadline_s=round(now + self.spec.window, 3))

    def _follow(self, c: httpx.Client) -> bool:
        r = c.get(f"{self.url}/v1/batches/{self.state['id']}")
        r.raise_for_status()
        b = r.json()
        now = round(time.time() - self.t0, 3)
        self.state.update(status=b["status"], request_counts=b["request_counts"])
        if b["status"] in TERMINAL:
            self.state["ended_s"] = now
            self.state["done_by_deadline"] = b["status"] == "completed" and now <= self.state["deadline_s"]
            return True
        return False
