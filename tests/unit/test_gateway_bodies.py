"""Hostile bodies against the gateway, without servers: every body is held to its route's limit and a
JSON body to UTF-8 and a depth before any route runs (400/413 with a sentence, never a 500 and never
the input echoed back); a deploy's code archive is looked into in a thread within limits (a
decompression bomb is a 413 and the event loop answers meanwhile); no error names a host path."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
import threading

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.gateway import routes_deployments
from levers9.gateway.auth import Caller
from levers9.gateway.body_rules import (
    API_JSON_LIMIT,
    MAX_JSON_DEPTH,
    BodyRule,
    body_rule,
    declared_length,
    depth_over,
    json_problem,
)
from levers9.gateway.code_archive import MAX_ENTRIES, inspect_code, path_problem
from levers9.gateway.errors import validation_errors
from levers9.gateway.host_paths import PLACEHOLDER, hostless
from levers9.gateway.service import GatewayService
from levers9.runtime.config import Settings
from levers9.runtime.tokens import token_hash

USER = "l9_user"
LIMITS = {"code_limit": 16 << 20, "file_limit": 1 << 30, "call_limit": 16 << 20}
DEEP = b"[" * 10_000 + b"]" * 10_000


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# ---- pure: the rules -----------------------------------------------------------------------------

def test_each_route_gets_its_rule_and_proxied_calls_none():
    assert body_rule("GET", "/api/v1/images", **LIMITS) is None
    assert body_rule("POST", "/endpoint/hello", **LIMITS) is None  # the runner checks, routes_invoke limits
    assert body_rule("POST", "/api/v1/images", **LIMITS) == BodyRule(API_JSON_LIMIT, True, "a JSON body of the API")
    assert body_rule("POST", "/function/app/f", **LIMITS).limit == 16 << 20
    assert not body_rule("POST", "/api/v1/deployments", **LIMITS).json  # multipart: its spec is checked by the route
    assert not body_rule("PUT", "/api/v1/volumes/v/files/a.bin", **LIMITS).json


@pytest.mark.parametrize("body, words", [
    (DEEP, f"nests deeper than {MAX_JSON_DEPTH} levels"),
    (nested(MAX_JSON_DEPTH + 1), "nests deeper"),
    (b'{"name": "\xff"}', "not UTF-8 (an invalid byte at offset 10)"),
    (b"{nope", "the body is not JSON"),
])
def test_a_bad_json_body_gets_a_sentence(body, words):
    assert words in json_problem(body)


def test_good_json_and_empty_bodies_pass():
    assert json_problem(nested(MAX_JSON_DEPTH)) == ""
    assert json_problem(b"") == json_problem(b"  \n") == json_problem(b'{"a": [1, {"b": null}]}') == ""


@given(st.recursive(st.none() | st.integers() | st.text(max_size=3),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=30))
def test_depth_over_agrees_with_a_recursive_count(doc):
    def depth(node):
        children = list(node.values()) if isinstance(node, dict) else node if isinstance(node, list) else None
        return 0 if children is None else 1 + max(map(depth, children), default=0)

    for limit in range(0, 6):
        assert depth_over(doc, limit) == (depth(doc) > limit)


def test_content_length_must_be_a_number():
    assert declared_length(None) is None and declared_length(" 12 ") == 12
    with pytest.raises(ValueError, match="is not a number of bytes"):
        declared_length("-1")


def test_validation_errors_never_echo_the_input():
    errors = validation_errors([{"type": "string_too_long", "loc": ("body", "name"), "msg": "too long",
                                 "input": "x" * 1_000_000, "ctx": {"max_length": 200}}])
    assert errors == [{"type": "string_too_long", "loc": ["body", "name"], "msg": "too long"}]


@pytest.mark.parametrize("text", [
    "the keyring file /root/.levers9/keyring.json cannot be read: Permission denied",
    "juicefs mount returned but /tmp/l9/data/gateway/volumes/v is not mounted",
    "connect to '/var/run/postgresql/.s.PGSQL.5432' failed",
])
def test_host_paths_are_replaced(text):
    out = hostless(text)
    assert PLACEHOLDER in out and "/root" not in out and "/tmp/" not in out and "/var/" not in out


def test_api_paths_and_container_paths_are_kept():
    for text in ("POST /api/v1/images: no", "see /endpoint/hello", "File /app/main.py, line 3", "http://h:1/tmp/x"):
        assert hostless(text) == text


# ---- pure: the code archive ------------------------------------------------------------------------

class Zeros(io.RawIOBase):
    def __init__(self, n: int):
        self.n = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        k = min(len(b), self.n)
        b[:k] = bytes(k)
        self.n -= k
        return k


def bomb(size: int = 1 << 30) -> bytes:
    """app.py and `size` bytes of zeros: about 1 MB per GiB."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        app = tarfile.TarInfo("app.py")
        app.size = 4
        tar.addfile(app, io.BytesIO(b"x=1\n"))
        zeros = tarfile.TarInfo("zeros.bin")
        zeros.size = size
        tar.addfile(zeros, io.BufferedReader(Zeros(size)))
    return buf.getvalue()


def archive(members: list[tarfile.TarInfo]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(b"\0" * m.size) if m.isfile() else None)
    return buf.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, size
    return info


def test_a_decompression_bomb_is_413_naming_the_limit():
    verdict = inspect_code(bomb())
    assert verdict.status == 413 and "unpacks to more than 256 MiB" in verdict.problem


def test_an_archive_of_too_many_entries_is_413():
    verdict = inspect_code(archive([member(f"f{i}") for i in range(30)]), max_entries=20)
    assert verdict.status == 413 and "more than 20 entries" in verdict.problem
    assert MAX_ENTRIES >= 10_000


def test_the_count_of_unpacked_bytes_holds_even_when_sizes_are_small():
    verdict = inspect_code(archive([member(f"f{i}", size=100) for i in range(50)]), max_unpacked=4096)
    assert verdict.status == 413


@pytest.mark.parametrize("m, words", [
    (member("/etc/passwd"), "absolute path"),
    (member("a/../../x"), "leads out"),
    (member("dev", tarfile.CHRTYPE), "device or a fifo"),
    (member("pipe", tarfile.FIFOTYPE), "device or a fifo"),
    (member("link", tarfile.SYMTYPE, "/etc/shadow"), "points out"),
    (member("a/link", tarfile.SYMTYPE, "../../x"), "points out"),
    (member("hard", tarfile.LNKTYPE, "../x"), "points out"),
])
def test_an_entry_whose_path_leaves_the_tree_is_refused(m, words):
    assert words in path_problem(m)
    verdict = inspect_code(archive([member("app.py"), m]))
    assert verdict.status == 422 and words in verdict.problem


def test_links_inside_the_tree_are_fine():
    assert path_problem(member("a/link", tarfile.SYMTYPE, "../b")) == ""
    assert path_problem(member("a/hard", tarfile.LNKTYPE, "b")) == ""


# ---- the app: the middleware, the routes ---------------------------------------------------------

@pytest.fixture
def gateway():
    gw = GatewayService(Settings.load(env={}))
    app = gw.app()
    gw.tokens[token_hash(USER)] = Caller(workspace="default", token_id="t-user")
    return gw, app


def client(app) -> httpx.AsyncClient:  # type: ignore[no-untyped-def]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw",
                             headers={"Authorization": f"Bearer {USER}"})


JSON_ROUTES = [("POST", "/api/v1/images"), ("POST", "/api/v1/containers"), ("POST", "/function/app/f"),
               ("POST", "/api/v1/tokens"), ("POST", "/api/v1/clusters"), ("POST", "/api/v1/clusters/gpu/share"),
               ("POST", "/api/v1/volumes"), ("POST", "/api/v1/secrets"), ("POST", "/api/v1/catalogues"),
               ("POST", "/api/v1/workers/w1/drain"), ("DELETE", "/api/v1/tokens/t1")]


@pytest.mark.parametrize("method, path", JSON_ROUTES)
@pytest.mark.parametrize("body, status", [(DEEP, 400), (b'{"a": "\xff\xfe"}', 400), (b"{not json", 400)])
async def test_every_json_route_answers_bad_json_with_400(gateway, method, path, body, status):
    async with client(gateway[1]) as c:
        r = await c.request(method, path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["detail"].startswith(f"{method} {path}: ")


async def chunks(*parts: bytes):  # type: ignore[no-untyped-def]
    for part in parts:  # no Content-Length: the middleware counts what comes
        yield part


async def test_an_oversized_body_is_413_before_it_is_read(gateway):
    async with client(gateway[1]) as c:
        declared = await c.post("/api/v1/tokens", content=b"x", headers={"content-length": str(60 << 20)})
        streamed = await c.post("/api/v1/tokens", content=chunks(b'{"name": "', b"x" * (API_JSON_LIMIT + 1), b'"}'))
    for r in (declared, streamed):
        assert r.status_code == 413 and "the limit for a JSON body of the API is 1 MiB" in r.json()["detail"]
        assert len(r.content) < 1000  # never the body echoed


async def test_a_long_field_under_the_limit_gets_a_422_without_its_value(gateway):
    async with client(gateway[1]) as c:
        r = await c.post("/api/v1/tokens", json={"name": "x" * 500_000})
    assert r.status_code == 422 and len(r.content) < 1000 and "xxxx" not in r.text


async def test_a_deep_deploy_spec_is_400_and_a_build_pool_container_403(gateway):
    async with client(gateway[1]) as c:
        deploy = await c.post("/api/v1/deployments", data={"spec": DEEP.decode()},
                              files={"code": ("code.tar.gz", b"x", "application/gzip")})
        build = await c.post("/api/v1/containers", json={"pool": "build"})
    assert deploy.status_code == 400 and "the deployment spec: the JSON nests deeper" in deploy.json()["detail"]
    assert build.status_code == 403 and "pool 'build' is refused" in build.json()["detail"]


async def test_a_bomb_deploy_is_413_and_the_loop_answers_while_it_is_looked_into(gateway, monkeypatch):
    _, app = gateway
    started, release = threading.Event(), threading.Event()
    real = routes_deployments.archive_problem

    def slow_inspection(data: bytes, module: str) -> tuple[int, str]:
        started.set()
        release.wait(timeout=30)  # on the event loop (the old code) this would block every other request
        return real(data, module)

    monkeypatch.setattr(routes_deployments, "archive_problem", slow_inspection)
    spec = json.dumps({"name": "hello", "code": {"module": "app", "handler": "hello"}})
    async with client(app) as c:
        deploy = asyncio.create_task(c.post("/api/v1/deployments", data={"spec": spec},
                                            files={"code": ("code.tar.gz", bomb(), "application/gzip")}))
        assert await asyncio.to_thread(started.wait, 30)
        who = await c.get("/api/v1/whoami")  # answered while the archive is still being looked into
        assert who.status_code == 200 and not deploy.done()
        release.set()
        r = await deploy
    assert r.status_code == 413 and "the limit is 256 MiB unpacked" in r.json()["detail"]


def test_a_sandbox_files_and_stdin_bodies_are_bytes_but_a_files_delete_is_json():
    """CI: a DELETE .../files with a deep JSON body reached the route (404) instead of the JSON rule's 400."""
    from levers9.gateway.body_rules import body_rule

    limits = {"code_limit": 1 << 20, "file_limit": 1 << 20, "call_limit": 1 << 20}
    put = body_rule("PUT", "/api/v1/sandboxes/s1/files", **limits)
    stdin = body_rule("POST", "/api/v1/sandboxes/s1/exec/e1/stdin", **limits)
    trace = body_rule("TRACE", "/api/v1/sandboxes/s1/files", **limits)  # the route's 405, not a JSON 400
    assert put is not None and not put.json and stdin is not None and not stdin.json
    assert trace is not None and not trace.json
    for method, path in (("DELETE", "/api/v1/sandboxes/s1/files"), ("POST", "/api/v1/sandboxes/s1/exec"),
                         ("POST", "/api/v1/sandboxes/s1/snapshot"), ("DELETE", "/api/v1/sandboxes/s1")):
        rule = body_rule(method, path, **limits)
        assert rule is not None and rule.json, (method, path)
