"""The stand-in API server over HTTP: the REST paths `kubectl` and the official client use.

    api = ApiServer().start()                 # a free loopback port; api.url
    api.kubeconfig(path, token=ADMIN_TOKEN)    # for kubectl and the client
    ...; api.audit                            # every request: verb, resource, subresource, namespace, ...
    api.stop()

Requests authenticate with a bearer token (api.tokens) and pass RBAC (tests/kube/apiserver/rbac.py).
`api.faults` holds callables (request info -> ApiError or None) run before a request is served, to
inject conflicts and outages.
"""

from __future__ import annotations

import json
import random
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import yaml

from tests.kube.apiserver import openapi, patch, rbac, tls
from tests.kube.apiserver.errors import ApiError
from tests.kube.apiserver.kinds import group_list, resource_list
from tests.kube.apiserver.selectors import SelectorError, parse_fields, parse_labels
from tests.kube.apiserver.store import Store
from tests.kube.apiserver.tables import table

ADMIN_TOKEN = "admin-token"
NAMESPACE_SUBRESOURCES = {"status", "finalize"}


@dataclass
class Request:
    verb: str
    path: str
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    user: str = ""
    pod: str = ""  # the pod a ServiceAccount token was issued to
    user_agent: str = ""
    code: int = 0
    resource_request: bool = True


def request_info(method: str, path: str, query: dict) -> Request:
    """What a request is about, as the API server's RequestInfoFactory parses it."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return Request(method.lower(), path, resource_request=False)
    if not rest:
        return Request(method.lower(), path, resource_request=False)
    info = Request("", path, group, version)
    if rest[0] == "namespaces" and len(rest) > 1:
        info.namespace = rest[1]
        if len(rest) > 2 and rest[2] not in NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    info.resource = rest[0]
    info.name = rest[1] if len(rest) > 1 else ""
    info.subresource = rest[2] if len(rest) > 2 else ""
    watching = query.get("watch", [""])[0] in ("true", "1")
    info.verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
    if method == "GET":
        info.verb = "watch" if watching else ("get" if info.name else "list")
    elif method == "DELETE":
        info.verb = "delete" if info.name else "deletecollection"
    return info


class ApiServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, bookmark_interval: float = 1.0,
                 watch_timeout: float = 60.0, audit_path: str | Path | None = None,
                 cert_dir: str | Path | None = None):
        self.store = Store()
        self._tmp = None
        if cert_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="standin-")
            cert_dir = self._tmp.name
        self.cert, key = tls.make_certificate(Path(cert_dir))
        self.bookmark_interval, self.watch_timeout = bookmark_interval, watch_timeout
        self.tokens: dict[str, rbac.User] = {ADMIN_TOKEN: rbac.ADMIN}
        self.faults: list = []
        self.audit: list[dict] = []
        self.audit_path = Path(audit_path) if audit_path else None
        self._audit_lock = threading.Lock()
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.daemon_threads = True
        # the handshake happens in the handler's thread, so one slow client never holds up accept()
        self._httpd.socket = tls.server_context(self.cert, key).wrap_socket(
            self._httpd.socket, server_side=True, do_handshake_on_connect=False)
        self._httpd.api = self
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"https://{host}:{port}"

    def start(self) -> ApiServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self.store.cond:
            self.store.cond.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def add_token(self, token: str, user: rbac.User) -> None:
        self.tokens[token] = user

    def kubeconfig(self, path: str | Path, token: str = ADMIN_TOKEN, namespace: str = "default") -> Path:
        """A kubeconfig file pointing at this server with `token` (kubectl and the Python client read it)."""
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "standin",
               "clusters": [{"name": "standin", "cluster": {
                   "server": self.url, "certificate-authority-data": tls.ca_data(self.cert)}}],
               "users": [{"name": "standin-user", "user": {"token": token}}],
               "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin-user",
                                                            "namespace": namespace}}]}
        path = Path(path)
        path.write_text(yaml.safe_dump(cfg))
        return path

    def record(self, info: Request) -> None:
        entry = asdict(info)
        entry["time"] = time.time()
        with self._audit_lock:
            self.audit.append(entry)
            if self.audit_path is not None:
                with open(self.audit_path, "a") as f:
                    f.write(json.dumps(entry) + "\n")

    # -- serving -------------------------------------------------------------------------------
    def serve(self, h: _Handler) -> None:
        split = urlsplit(h.path)
        query = parse_qs(split.query)
        info = request_info(h.command, split.path, query)
        info.user_agent = h.headers.get("User-Agent", "")
        h.read_body()  # always: an answer before the body is read would leave it on the connection
        try:
            auth = h.headers.get("Authorization", "")
            user = self.tokens.get(auth[7:]) if auth.startswith("Bearer ") else None
            if user is None:
                raise ApiError(401, "Unauthorized")
            info.user, info.pod = user.name, user.pod
            if not info.resource_request:
                status, body, ctype = self._non_resource(info.path, h)
                info.code = status
                h.reply(status, body, ctype)
                return
            if not rbac.allowed(self.store, user, info.verb, info.group, info.resource, info.subresource,
                                info.namespace, info.name):
                raise rbac.forbidden(user, info.verb, info.group, info.resource, info.subresource,
                                     info.namespace, info.name)
            for fault in list(self.faults):
                err = fault(info)
                if err is not None:
                    raise err
            if info.verb == "watch":
                self.store.type_of(info.group, info.version, info.resource)
                info.code = 200
                self.record(info)
                self._watch(h, info, query)
                return
            status, body, warnings = self._resource(h, info, query)
            info.code = status
            h.reply(status, body, warnings=warnings)
        except ApiError as err:
            info.code = err.code
            h.reply(err.code, err.status())
        except (SelectorError, ValueError) as err:
            info.code = 400
            h.reply(400, ApiError(400, str(err)).status())
        if info.verb != "watch":
            self.record(info)

    def _non_resource(self, path: str, h) -> tuple[int, object, str]:
        path = path.rstrip("/") or "/"
        s = self.store
        if path in ("/healthz", "/readyz", "/livez"):
            return 200, "ok", "text/plain"
        if path == "/version":
            return 200, {"major": "1", "minor": "32", "gitVersion": "v1.32.0-standin",
                         "platform": "linux/amd64"}, ""
        if path == "/api":
            host = h.headers.get("Host", "")
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": host}]}, ""
        if path == "/apis":
            return 200, group_list(list(s.types.values())), ""
        if path == "/api/v1":
            return 200, resource_list(list(s.types.values()), "v1"), ""
        parts = path.split("/")
        if path.startswith("/apis/") and len(parts) == 4:
            gv = f"{parts[2]}/{parts[3]}"
            if any(t.group_version == gv for t in s.types.values()):
                return 200, resource_list(list(s.types.values()), gv), ""
        if path.startswith("/apis/") and len(parts) == 3:
            for g in group_list(list(s.types.values()))["groups"]:
                if g["name"] == parts[2]:
                    return 200, {"kind": "APIGroup", "apiVersion": "v1", **g}, ""
        if path.startswith("/openapi/"):
            doc = openapi.document(s, path)
            if doc is not None:
                return 200, doc, ""
        raise ApiError(404, "the server could not find the requested resource")

    def _resource(self, h, info: Request, query: dict) -> tuple[int, object, list[str]]:
        s = self.store
        t = s.type_of(info.group, info.version, info.resource)
        if t.namespaced != bool(info.namespace) and info.verb not in ("list", "watch", "deletecollection"):
            if t.namespaced or info.resource != "namespaces":
                raise ApiError(404, "the server could not find the requested resource")
        ns = info.namespace if t.namespaced else ""
        strict = query.get("fieldValidation", ["Warn"])[0] == "Strict"
        sub = info.subresource
        if sub and not ((sub == "status" and t.status) or (sub == "scale" and t.scale)):
            raise ApiError(404, "the server could not find the requested resource")
        body = h.body()
        if info.verb == "get":
            if sub == "scale":
                return 200, s.get_scale(t, ns, info.name), []
            obj = s.get(t, ns, info.name)
            if _wants_table(h):
                return 200, table(t, [obj], obj["metadata"]["resourceVersion"], _include(query)), []
            return 200, obj, []
        if info.verb == "list":
            items, rv = s.list(t, info.namespace or None, parse_labels(_q(query, "labelSelector")),
                               parse_fields(_q(query, "fieldSelector")))
            if _wants_table(h):
                return 200, table(t, items, rv, _include(query)), []
            return 200, {"kind": f"{t.kind}List", "apiVersion": t.group_version,
                         "metadata": {"resourceVersion": rv}, "items": items}, []
        if info.verb == "create":
            if sub:
                raise ApiError(405, f"create is not allowed on {info.resource}/{sub}")
            obj, warnings = s.create(t, info.namespace, _json(body), strict)
            return 201, obj, warnings
        if info.verb == "update":
            obj = _json(body)
            if sub == "scale":
                return 200, s.update_scale(t, ns, info.name, obj), []
            out, warnings = s.update(t, ns, info.name, obj, sub, strict)
            return 200, out, warnings
        if info.verb == "patch":
            return 200, *self._patch(t, ns, info, h.headers.get("Content-Type", ""), body, strict)
        if info.verb == "delete":
            opts = _json(body) if body else {}
            pre = opts.get("preconditions") or {}
            deleted = s.delete(t, ns, info.name, pre.get("uid"), pre.get("resourceVersion"))
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                         "details": {"name": info.name, "group": t.group, "kind": t.plural,
                                     "uid": deleted["metadata"]["uid"]}}, []
        if info.verb == "deletecollection":
            items, _ = s.list(t, info.namespace or None, parse_labels(_q(query, "labelSelector")),
                              parse_fields(_q(query, "fieldSelector")))
            for o in items:
                s.delete(t, o["metadata"].get("namespace", ""), o["metadata"]["name"])
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}, []
        raise ApiError(405, f"{info.verb} is not supported")

    def _patch(self, t, ns: str, info: Request, ctype: str, body: bytes, strict: bool):
        if ctype.split(";")[0].strip() == patch.APPLY:
            raise ApiError(415, "server-side apply is not served by this stand-in: use client-side apply")
        p = _json(body)
        s = self.store
        for _ in range(10):  # as the API server's GuaranteedUpdate: re-read when a write raced ours
            if info.subresource == "scale":
                cur = s.get_scale(t, ns, info.name)
            else:
                cur = s.get(t, ns, info.name)
            rv = cur["metadata"]["resourceVersion"]
            new = patch.apply(ctype, cur, p)
            pinned = (new.get("metadata") or {}).get("resourceVersion") not in (None, rv)
            new.setdefault("metadata", {}).setdefault("resourceVersion", rv)
            try:
                if info.subresource == "scale":
                    return s.update_scale(t, ns, info.name, new), []
                return s.update(t, ns, info.name, new, info.subresource, strict)
            except ApiError as err:
                if err.code != 409 or pinned:
                    raise
        raise ApiError(409, "too many concurrent writes")

    def _watch(self, h, info: Request, query: dict) -> None:
        s = self.store
        t = s.type_of(info.group, info.version, info.resource)
        ns = info.namespace or None
        labels = parse_labels(_q(query, "labelSelector"))
        fields = parse_fields(_q(query, "fieldSelector"))
        bookmarks = _q(query, "allowWatchBookmarks") == "true"
        timeout = float(_q(query, "timeoutSeconds") or self.watch_timeout * (1 + random.random()))
        start_rv = _q(query, "resourceVersion") or ""
        h.start_stream()
        deadline = time.monotonic() + timeout
        with s.cond:
            if start_rv in ("", "0"):
                items, rv = s.list(t, ns, labels, fields)
                pending = [("ADDED", o) for o in items]
                last = int(rv)
            else:
                last = int(start_rv)
                pending = []
                if last < s.compacted:
                    err = ApiError(410, f"too old resource version: {start_rv} ({s.compacted})")
                    pending = [("ERROR", err.status())]
        next_bookmark = time.monotonic() + self.bookmark_interval
        try:
            while True:
                for kind, obj in pending:
                    h.send_chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                    if kind == "ERROR":
                        return
                now = time.monotonic()
                if now >= deadline or self._stopping.is_set():
                    return
                if bookmarks and now >= next_bookmark:
                    h.send_chunk(json.dumps({"type": "BOOKMARK", "object": {
                        "kind": t.kind, "apiVersion": t.group_version,
                        "metadata": {"resourceVersion": str(last)}}}).encode() + b"\n")
                    next_bookmark = now + self.bookmark_interval
                with s.cond:
                    pending = self._events_after(t, ns, labels, fields, last)
                    if not pending:
                        s.cond.wait(min(deadline,
                                        next_bookmark if bookmarks else deadline) - time.monotonic())
                        pending = self._events_after(t, ns, labels, fields, last)
                    last = pending[-1][0] if pending else s.rv  # nothing after `last` concerns us
                pending = [(k, o) for _, k, o in pending]
        except (BrokenPipeError, ConnectionResetError):
            return
        finally:
            h.end_stream()

    def _events_after(self, t, ns, labels, fields, last: int) -> list[tuple[int, str, dict]]:
        out = []
        for rv, key, ons, kind, obj, old in self.store.history:
            if rv <= last or key != t.key or (ns is not None and ons != ns):
                continue
            now_in = Store._matches(obj, labels, fields)
            was_in = old is not None and Store._matches(old, labels, fields)
            if kind == "MODIFIED" and now_in != was_in:
                kind = "ADDED" if now_in else "DELETED"
            elif not now_in:
                continue
            out.append((rv, kind, obj))
        return out


def _q(query: dict, key: str) -> str | None:
    v = query.get(key)
    return v[0] if v else None


def _json(body: bytes):
    if body[:4] == b"k8s\x00":  # the protobuf envelope: only JSON is served here
        raise ApiError(415,
                       "the body of the request was in an unknown format - accepted media types include: "
                            "application/json, application/yaml")
    try:
        return json.loads(body or b"null")
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None


def _wants_table(h) -> bool:
    return "as=Table" in h.headers.get("Accept", "")


def _include(query: dict) -> str:
    return _q(query, "includeObject") or "Metadata"


class _HTTPServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], OSError):  # a client hanging up mid-request is no error
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "standin-apiserver"

    def log_message(self, *args) -> None:
        pass

    _body = b""

    def read_body(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self._body = self.rfile.read(n) if n else b""

    def body(self) -> bytes:
        return self._body

    def reply(self, status: int, body, ctype: str = "", warnings: list[str] = ()) -> None:
        if isinstance(body, (dict, list)):
            data, ctype = json.dumps(body).encode(), "application/json"
        else:
            data, ctype = str(body).encode(), ctype or "text/plain"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for w in warnings:
            self.send_header("Warning", f'299 - "{w}"')
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_stream(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass

    def _serve(self) -> None:
        self.server.api.serve(self)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve
