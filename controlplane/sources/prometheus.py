"""Prometheus as a metric source, through prometheus-api-client, as KEDA's Prometheus scaler reads it.

Every query has a timeout and no retries (the next poll is the retry). A trigger may carry its own
serverAddress, unsafeSsl, timeout (ms), customHeaders, queryParameters and authModes (its metadata),
and its TriggerAuthentication's resolved parameters (bearerToken; username/password; ca, cert, key;
customAuthHeader/customAuthValue). Certificates may be PEM text (as KEDA takes them from a Secret) or
file paths. An HTTP error, a timeout or more than one series is an error for that trigger only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Mapping

import requests
import urllib3
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from autoscaler.prometheus import QueryError
from controlplane.sources.base import DEFAULT_WINDOW, QuerySource, Vector
from controlplane.sources.deadline import DeadlineExceeded, call_with_deadline

DEFAULT_TIMEOUT = 5.0  # seconds; KEDA's default HTTP timeout is 3 s, Prometheus' query timeout 2 min


def _bool(v) -> bool:
    return v if isinstance(v, bool) else str(v).strip().lower() == "true"


def _pairs(text: str, field: str) -> dict[str, str]:
    """KEDA's "k1=v1,k2=v2" metadata strings."""
    out = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        if "=" not in part:
            raise ValueError(f"{field}: {part!r} is not key=value")
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def raw_triggers(spec) -> dict[str, dict]:
    """Trigger name -> its raw YAML entry (metadata, authenticationRef), from a loaded Spec."""
    s = spec.doc.get("spec", {})
    raw = s.get("triggers") if spec.kind == "ScaledObject" else s.get("policy", {}).get(spec.policy_type, {})
    raw = raw.get("triggers", []) if isinstance(raw, dict) else raw or []
    return {t.name: r for t, r in zip(spec.triggers, raw)}


def resolve_trigger_authentication(doc: dict, secrets: Mapping[str, Mapping[str, str]] | None = None,
                                   env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A TriggerAuthentication's parameters: spec.secretTargetRef from `secrets` (name -> key -> value,
    e.g. read from Secret manifests) and spec.env from the environment."""
    name = doc.get("metadata", {}).get("name", "?")
    spec = doc.get("spec") or {}
    secrets, env = secrets or {}, os.environ if env is None else env
    params = {}
    for i, ref in enumerate(spec.get("secretTargetRef") or []):
        where = f"TriggerAuthentication {name}: spec.secretTargetRef[{i}]"
        try:
            params[ref["parameter"]] = secrets[ref["name"]][ref["key"]]
        except KeyError as exc:
            raise ValueError(f"{where}: no {exc.args[0]!r} (secret {ref.get('name')!r}, "
                             f"key {ref.get('key')!r})") from None
    for i, ref in enumerate(spec.get("env") or []):
        if ref.get("name") not in env:
            raise ValueError(f"TriggerAuthentication {name}: spec.env[{i}]: "
                             f"variable {ref.get('name')!r} not set")
        params[ref["parameter"]] = env[ref["name"]]
    return params


class PrometheusSource(QuerySource):
    """url: the Prometheus server used when a trigger has no serverAddress (or always, override=True,
    as for a local fleet whose Prometheus port is chosen at start). auth: resolved TriggerAuthentication
    parameters for every trigger and the aggregates; trigger_auth: per trigger name. pin_time: evaluate
    at observe()'s `now` (same clock as Prometheus) instead of the server's current time."""

    def __init__(self, url: str, *, engine: str = "vllm", window: float = DEFAULT_WINDOW, selector: str = "",
                 aggregates=None, timeout: float = DEFAULT_TIMEOUT, auth: dict | None = None,
                 auth_modes: str = "", trigger_auth: dict[str, dict] | None = None, unsafe_ssl: bool = False,
                 override: bool = False, pin_time: bool = False):
        super().__init__(engine, window, selector, aggregates)
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.auth = auth or {}
        self.auth_modes = auth_modes
        self.trigger_auth = trigger_auth or {}
        self.unsafe_ssl = unsafe_ssl
        self.override = override
        self.pin_time = pin_time
        self.raw: dict[str, dict] = {}
        self._clients: dict[tuple, PrometheusConnect] = {}
        self._down: dict[str, str] = {}
        self._now: float | None = None
        self._tmp: str | None = None

    def observe(self, spec, now: float, current: int, ready: int | None = None):
        self.raw = raw_triggers(spec) if spec is not None else {}
        self._now = now
        return super().observe(spec, now, current, ready)

    def begin(self) -> None:
        self._down = {}  # a server that failed is not asked again in this round

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    # -- connections -----------------------------------------------------------------------------------
    def _pem(self, value: str) -> str:
        """A file path for a certificate given as PEM text or as a path."""
        if not value.lstrip().startswith("-----BEGIN"):
            return value
        self._tmp = self._tmp or tempfile.mkdtemp(prefix="slopilot-tls-")
        fd, path = tempfile.mkstemp(dir=self._tmp, suffix=".pem")
        with os.fdopen(fd, "w") as f:
            f.write(value)
        return path

    def _client(self, url: str, params: dict, modes: str, unsafe: bool, headers: dict) -> PrometheusConnect:
        key = (url, tuple(sorted(params.items())), modes, unsafe, tuple(sorted(headers.items())))
        client = self._clients.get(key)
        if client is not None:
            return client
        modes_set = {m.strip() for m in modes.split(",") if m.strip()} or {
            m for m, k in (("bearer", "bearerToken"), ("basic", "username"), ("tls", "cert"),
                           ("custom", "customAuthHeader")) if k in params}
        headers = dict(headers)
        basic = None
        required = {"bearer": ["bearerToken"], "basic": ["username"], "tls": ["cert", "key"],
                    "custom": ["customAuthHeader", "customAuthValue"]}
        missing = [k for m in sorted(modes_set) for k in required.get(m, []) if k not in params]
        if missing:
            raise QueryError(f"authModes {','.join(sorted(modes_set))}: "
                             f"missing parameter(s) {', '.join(missing)}")
        if "bearer" in modes_set:
            headers["Authorization"] = f"Bearer {params['bearerToken']}"
        if "basic" in modes_set:
            basic = (params["username"], params.get("password", ""))
        if "custom" in modes_set:
            headers[params["customAuthHeader"]] = params["customAuthValue"]
        session = requests.Session()
        if unsafe:  # asked for: KEDA's unsafeSsl
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        session.verify = False if unsafe else (self._pem(params["ca"]) if params.get("ca") else True)
        if "tls" in modes_set:
            session.cert = (self._pem(params["cert"]), self._pem(params["key"]))
        no_retry = Retry(total=0, read=False, raise_on_status=False)  # the next poll is the retry
        client = PrometheusConnect(url, headers=headers or None, auth=basic, session=session, retry=no_retry,
                                   timeout=self.timeout)
        self._clients[key] = client
        return client

    # -- QuerySource ---------------------------------------------------------------------------------------
    def query(self, text: str, trigger=None) -> Vector:
        name = getattr(trigger, "name", None)
        md = (self.raw.get(name) or {}).get("metadata", {}) if name else {}
        address = getattr(trigger, "server_address", "")
        url = (self.url if self.override or not address else address).rstrip("/")
        if url in self._down:
            raise QueryError(self._down[url])
        params = self.trigger_auth.get(name, self.auth) if name else self.auth
        timeout = float(md["timeout"]) / 1000 if md.get("timeout") else self.timeout  # KEDA: milliseconds
        query_params = _pairs(md.get("queryParameters", ""), "queryParameters")
        if md.get("namespace"):  # for namespaced query frontends (Thanos), as KEDA passes it
            query_params.setdefault("namespace", md["namespace"])
        if self.pin_time and self._now is not None:
            query_params.setdefault("time", f"{self._now:.3f}")
        client = self._client(url, params, md.get("authModes", self.auth_modes),
                              _bool(md.get("unsafeSsl", self.unsafe_ssl)),
                              _pairs(md.get("customHeaders", ""), "customHeaders"))
        try:  # the timeout bounds the whole answer, as Go's http.Client.Timeout does for KEDA
            def ask():
                return client.custom_query(text, params=query_params, timeout=timeout)

            result = call_with_deadline(ask, timeout, "prometheus")
        except DeadlineExceeded:  # still being dripped: that client's session is left to its thread
            self._clients = {k: c for k, c in self._clients.items() if c is not client}
            self._down[url] = f"prometheus at {url}: no answer within {timeout:g}s (the whole answer)"
            raise QueryError(self._down[url]) from None
        except requests.Timeout:
            self._down[url] = f"prometheus at {url}: no answer within {timeout:g}s"
            raise QueryError(self._down[url]) from None
        except requests.RequestException as exc:
            self._down[url] = f"prometheus at {url}: {type(exc).__name__}: {exc}"
            raise QueryError(self._down[url]) from None
        except PrometheusApiClientException as exc:
            raise QueryError(f"prometheus query api returned error: {exc}") from None
        except ValueError as exc:  # a body that is not the API's JSON
            raise QueryError(f"prometheus at {url}: unreadable answer ({exc})") from None
        return _vector(result)


def _vector(result) -> Vector:
    """The API's data.result as (labels, value) pairs; a scalar answer is one sample without labels."""
    try:
        if len(result) == 2 and not isinstance(result[0], dict):
            return [({}, float(result[1]))]
        return [(r.get("metric", {}), float(r["value"][1])) for r in result]
    except (TypeError, KeyError, IndexError, ValueError) as exc:
        raise QueryError(f"prometheus query returned an unexpected result ({exc})") from None
