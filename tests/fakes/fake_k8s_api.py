"""A FAKE Kubernetes API server, for tests only: no Kubernetes runs on these machines.

It serves, over real HTTP in a thread of the test process, the REST paths the official client calls
for pods and secrets in a namespace: create, read, list (label selectors of `k=v` terms), delete,
and watch (chunked JSON lines from a resourceVersion). Every object it receives is validated against
the Kubernetes OpenAPI schema of KUBE_VERSION with kubernetes-validate (strict: unknown fields are
errors), plus the name and label rules the real server checks; an invalid object gets 422 with a
Status, as the real server answers. Tests drive what a cluster would do on its own: set a pod's
phase (Running, Failed ...), delete a pod behind the client's back, refuse a namespace (403) or
make the next call fail with any status.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import kubernetes_validate

KUBE_VERSION = "1.32"
KINDS = {"pods": "Pod", "secrets": "Secret"}
_PATH = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods|secrets)(?:/(?P<name>[^/]+))?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """Why the real API server would refuse `obj` (empty: it would take it)."""
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'.'.join(str(p) for p in e.path)}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [e.message]
    meta = obj.get("metadata") or {}
    errors = [] if _DNS_SUBDOMAIN.match(meta.get("name", "")) else [f"metadata.name {meta.get('name')!r} is invalid"]
    for key, value in (meta.get("labels") or {}).items():
        if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            errors.append(f"metadata.labels: {key}={value!r} is invalid")
    for key, value in (obj.get("data") or {}).items() if obj.get("kind") == "Secret" else ():
        try:
            base64.b64decode(value, validate=True)
        except ValueError:
            errors.append(f"data.{key}: not base64")
    return errors


@dataclass
class Fault:
    method: str
    resource: str
    status: int
    reason: str
    message: str


@dataclass
class State:
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (res, ns, name)
    events: list[tuple[int, str, str, str, dict[str, Any]]] = field(default_factory=list)  # rv, type, res, ns, obj
    version: int = 0
    faults: list[Fault] = field(default_factory=list)
    forbidden: set[str] = field(default_factory=set)  # namespaces answered 403
    closed: bool = False
    received: list[dict[str, Any]] = field(default_factory=list)  # every object sent, valid or not
    deletes: list[tuple[str, str, str, dict[str, list[str]]]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)


class FakeKubernetesAPI:
    """Start with `with FakeKubernetesAPI() as api:`; `api.url` is the server to point a client at."""

    def __init__(self) -> None:
        self.state = State()
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeKubernetesAPI":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.state.cond:
            self.state.closed = True  # watchers end their streams
            self.state.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # ---- what a cluster does on its own ---------------------------------------------------------

    def objects(self, resource: str, namespace: str) -> dict[str, dict[str, Any]]:
        with self.state.cond:
            return {n: o for (r, ns, n), o in self.state.objects.items() if r == resource and ns == namespace}

    def set_phase(self, namespace: str, name: str, phase: str, exit_code: int | None = None,
                  reason: str = "") -> None:
        def change(pod: dict[str, Any]) -> None:
            status: dict[str, Any] = {"phase": phase}
            if exit_code is not None:
                status["containerStatuses"] = [{"name": "worker", "ready": False, "restartCount": 0, "image": "",
                                                "imageID": "", "state": {"terminated": {"exitCode": exit_code,
                                                                                        "reason": reason}}}]
            pod["status"] = status
        _update(self.state, "pods", namespace, name, change)

    def delete_out_of_band(self, resource: str, namespace: str, name: str) -> None:
        _delete(self.state, resource, namespace, name)

    def fail_next(self, method: str, resource: str, status: int, reason: str = "", message: str = "") -> None:
        with self.state.cond:
            self.state.faults.append(Fault(method, resource, status, reason or "Injected", message or "injected"))

    def forbid(self, namespace: str) -> None:
        with self.state.cond:
            self.state.forbidden.add(namespace)


def _bump(state: State, kind: str, resource: str, namespace: str, obj: dict[str, Any]) -> None:
    state.version += 1
    obj.setdefault("metadata", {})["resourceVersion"] = str(state.version)
    state.events.append((state.version, kind, resource, namespace, json.loads(json.dumps(obj))))
    state.cond.notify_all()


def _update(state: State, resource: str, namespace: str, name: str, change: Any) -> None:
    with state.cond:
        obj = state.objects[(resource, namespace, name)]
        change(obj)
        _bump(state, "MODIFIED", resource, namespace, obj)


def _delete(state: State, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
    with state.cond:
        obj = state.objects.pop((resource, namespace, name), None)
        if obj is not None:
            _bump(state, "DELETED", resource, namespace, obj)
        return obj


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def _selects(selector: str, obj: dict[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    terms = [t.split("=", 1) for t in selector.split(",") if t]
    return all(labels.get(k.strip()) == v.strip() for k, v in terms)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked watch streams
    state: State

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str) -> tuple[str, str, str, dict[str, list[str]]] | None:
        length = int(self.headers.get("Content-Length") or 0)  # read first: the connection is kept alive
        self.payload: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
        url = urlparse(self.path)
        m = _PATH.match(url.path)
        if not m:
            self._send(404, _status(404, "NotFound", f"the fake serves no {url.path}"))
            return None
        ns, res, name = m["ns"], m["res"], m["name"] or ""
        with self.state.cond:
            if ns in self.state.forbidden:
                self._send(403, _status(403, "Forbidden", f'{res} is forbidden: User "system:serviceaccount:'
                                        f'levers9:pool-controller" cannot {method.lower()} resource "{res}" in '
                                        f'the namespace "{ns}"'))
                return None
            for fault in self.state.faults:
                if fault.method == method and fault.resource == res:
                    self.state.faults.remove(fault)
                    self._send(fault.status, _status(fault.status, fault.reason, fault.message))
                    return None
        return ns, res, name, parse_qs(url.query)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        route = self._route("POST")
        if route is None:
            return
        ns, res, _, _ = route
        obj = self.payload
        with self.state.cond:
            self.state.received.append(json.loads(json.dumps(obj)))
        errors = schema_errors(obj)
        if obj.get("kind") != KINDS[res]:
            errors.append(f"kind {obj.get('kind')!r} posted to {res}")
        if (obj.get("metadata") or {}).get("namespace", ns) != ns:
            errors.append("the namespace of the provided object does not match the namespace sent on the request")
        if errors:
            return self._send(422, _status(422, "Invalid", f"{KINDS[res]} is invalid: " + "; ".join(errors)))
        name = obj["metadata"]["name"]
        with self.state.cond:
            if (res, ns, name) in self.state.objects:
                return self._send(409, _status(409, "AlreadyExists", f'{res} "{name}" already exists'))
            obj["metadata"].update(namespace=ns, uid=str(uuid.uuid4()),
                                   creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            if res == "pods":
                obj["status"] = {"phase": "Pending"}
            self.state.objects[(res, ns, name)] = obj
            _bump(self.state, "ADDED", res, ns, obj)
            out = json.loads(json.dumps(obj))
        self._send(201, out)

    def do_GET(self) -> None:  # noqa: N802
        route = self._route("GET")
        if route is None:
            return
        ns, res, name, query = route
        if name:
            with self.state.cond:
                obj = self.state.objects.get((res, ns, name))
            return self._send(200, obj) if obj else self._send(404, _status(404, "NotFound", f'{res} "{name}" not found'))
        selector = (query.get("labelSelector") or [""])[0]
        if (query.get("watch") or [""])[0] in ("true", "1"):
            return self._watch(ns, res, selector, int((query.get("resourceVersion") or ["0"])[0] or 0),
                               float((query.get("timeoutSeconds") or ["30"])[0]))
        with self.state.cond:
            items = [o for (r, n, _), o in self.state.objects.items() if r == res and n == ns and _selects(selector, o)]
            body = {"apiVersion": "v1", "kind": f"{KINDS[res]}List", "items": items,
                    "metadata": {"resourceVersion": str(self.state.version)}}
            data = json.loads(json.dumps(body))
        self._send(200, data)

    def _watch(self, ns: str, res: str, selector: str, since: int, timeout: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deadline = time.monotonic() + timeout
        try:
            while True:
                with self.state.cond:
                    batch = [(v, t, o) for v, t, r, n, o in self.state.events
                             if v > since and r == res and n == ns and _selects(selector, o)]
                    since = max([since, *(v for v, _, _ in batch)])
                    closed = self.state.closed
                    if not batch and not closed:
                        self.state.cond.wait(max(0.0, min(0.5, deadline - time.monotonic())))
                for _, kind, obj in batch:
                    line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                if closed or time.monotonic() >= deadline:
                    break
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_DELETE(self) -> None:  # noqa: N802
        route = self._route("DELETE")
        if route is None:
            return
        ns, res, name, query = route
        with self.state.cond:
            self.state.deletes.append((res, ns, name, query))
        obj = _delete(self.state, res, ns, name)
        if obj is None:
            return self._send(404, _status(404, "NotFound", f'{res} "{name}" not found'))
        self._send(200, obj)
