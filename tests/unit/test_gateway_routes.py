"""The gateway's routes wired to a fake state (no servers): auth, status codes, messages, the events they append."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import socket
import tarfile
from typing import Any

import httpx
import msgspec
import pytest

from levers9.contracts import decode
from levers9.contracts import events as E
from levers9.contracts.spec import decode_spec
from levers9.gateway import routes_deployments, routes_internal
from levers9.gateway.auth import Caller
from levers9.gateway.service import GatewayService
from levers9.runtime.bus import Appended
from levers9.runtime.config import Settings
from levers9.runtime.tokens import token_hash

SPEC = {"name": "hello", "code": {"module": "app", "handler": "hello"}}
USER, WORKER, OTHER = "l9_user", "l9_worker", "l9_other"


def spec_json(**over: Any) -> str:
    return msgspec.json.encode(decode_spec(json.dumps({**SPEC, **over}))).decode()


class FakePool:
    """Answers the gateway's queries from `tables`, matched by a fragment of the SQL."""

    def __init__(self) -> None:
        self.rows: dict[str, list[dict]] = {}
        self.queries: list[str] = []

    def answer(self, fragment: str, rows: list[dict]) -> None:
        self.rows[fragment] = rows

    def _match(self, query: str) -> list[dict]:
        self.queries.append(query)
        return next((rows for fragment, rows in self.rows.items() if fragment in query), [])

    async def fetch(self, query: str, *args: Any) -> list[dict]:
        return self._match(query)

    async def fetchrow(self, query: str, *args: Any) -> dict | None:
        rows = self._match(query)
        return rows[0] if rows else None

    async def fetchval(self, query: str, *args: Any) -> Any:
        row = await self.fetchrow(query, *args)
        return next(iter(row.values())) if row else None


class FakeBus:
    def __init__(self, gw: GatewayService) -> None:
        self.gw = gw
        self.seq = 100
        self.published: list[Any] = []
        self.tasks: set[asyncio.Task] = set()
        self.filters: list[str] = []
        self.last_container_seq = 0

    async def publish(self, env: Any) -> Appended:
        self.seq += 1
        self.published.append(env)
        return Appended(seq=self.seq, duplicate=False)

    async def append(self, env: Any, expected: int) -> Appended:
        appended = await self.publish(env)
        task = asyncio.create_task(self.gw.advanced("deployments", appended.seq))  # the projection catches up
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return appended

    async def last_seq(self, filter_subject: str) -> int:
        self.filters.append(filter_subject)
        return self.last_container_seq

    def events(self) -> list[E.Event]:
        return [decode(msgspec.json.encode(env)).event for env in self.published]


@pytest.fixture
def gw():
    g = GatewayService(Settings.load(env={"LEVERS9_SECRET_KEY": ""}))
    g.pool = FakePool()
    g.bus = FakeBus(g)
    g.tokens = {token_hash(USER): Caller(workspace="default", token_id="u"),
                token_hash(OTHER): Caller(workspace="other", token_id="o"),
                token_hash(WORKER): Caller(workspace="default", token_id="w", scope="worker:w1")}
    return g


@contextlib.asynccontextmanager
async def client(gw: GatewayService, token: str | None = USER):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gw.app()), base_url="http://gw",
                                 headers=headers) as c:
        yield c


async def test_tokens_decide_who_may_call(gw):
    async with client(gw, None) as c:
        r = await c.get("/api/v1/whoami")
        assert r.status_code == 401 and "missing bearer token" in r.json()["detail"]
    async with client(gw, "l9_unknown") as c:
        r = await c.get("/api/v1/whoami")
        assert r.status_code == 401 and "unknown or revoked" in r.json()["detail"]
    async with client(gw, WORKER) as c:
        assert (await c.get("/api/v1/whoami")).json() == {"workspace": "default", "token_id": "w",
                                                         "scope": "worker:w1"}
        r = await c.get("/api/v1/deployments")
        assert r.status_code == 403 and r.json()["detail"] == "a worker token cannot call the user API"
    gw.pool.answer("FROM gateway.workers WHERE", [{"?column?": 1}])
    async with client(gw, OTHER) as c:
        r = await c.post("/api/v1/workers/w1/cordon")
        assert r.status_code == 403 and "use a token of workspace 'default'" in r.json()["detail"]
    async with client(gw) as c:
        assert (await c.post("/api/v1/workers/w1/drain")).status_code == 202
        r = await c.post("/api/v1/workers/w1/reboot")
        assert r.status_code == 404 and "use cordon, drain or uncordon" in r.json()["detail"]
    assert gw.bus.events() == [E.WorkerCordoned(worker_id="w1", drain=True)]
    assert gw.bus.published[0].workspace == "_sys"


async def test_a_bare_container_request_takes_millicores_and_mib(gw):
    async with client(gw) as c:
        r = await c.post("/api/v1/containers", json={"cpu_millicores": 500, "memory_mib": 128, "pool": "p"})
        assert r.status_code == 202, r.text
        assert set(r.json()) == {"container_id", "correlation_id", "event_id", "seq"}
        bad = await c.post("/api/v1/containers", json={"cpu": 0.5, "memory": 128})
        assert bad.status_code == 422 and "unknown field 'cpu'" in bad.json()["detail"]
        assert (await c.post("/api/v1/containers", json={"cpu_millicores": -1})).status_code == 422
    [ev] = gw.bus.events()
    assert isinstance(ev, E.ContainerRequested) and ev.spec is None and ev.reason == "api"
    assert (ev.resources.cpu_millicores, ev.resources.memory_mib, ev.pool) == (500, 128, "p")


def tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def test_deploy_appends_the_typed_spec_and_answers_once_projected(gw, monkeypatch):
    async def put_code(gw, workspace, data):
        return "ab" * 32, "code/ab.tar.gz"

    monkeypatch.setattr(routes_deployments, "put_code", put_code)
    code = {"code": ("code.tar.gz", tar_gz({"app.py": b"def hello(): ...\n"}), "application/gzip")}
    async with client(gw) as c:
        r = await c.post("/api/v1/deployments", data={"spec": json.dumps(SPEC)}, files=code)
        assert r.status_code == 201, r.text
        assert r.json() == {"deployment_id": "hello-v1", "name": "hello", "version": 1,
                            "url": "http://gw/endpoint/hello"}
        bad = await c.post("/api/v1/deployments", data={"spec": json.dumps({**SPEC, "name": "Hi There"})}, files=code)
        assert bad.status_code == 422 and "endpoint name 'Hi There' is not valid" in bad.json()["detail"]
        wrong = await c.post("/api/v1/deployments", data={"spec": json.dumps({**SPEC, "timeout_seconds": 0})},
                             files=code)
        assert wrong.status_code == 422 and "the deployment spec is not valid" in wrong.json()["detail"]
        other = await c.post("/api/v1/deployments", data={"spec": json.dumps({**SPEC, "code": {
            "module": "nope", "handler": "h"}})}, files=code)
        assert other.status_code == 422 and "has no nope.py" in other.json()["detail"]
    [ev] = gw.bus.events()
    assert isinstance(ev, E.DeploymentCreated) and ev.deployment_id == "hello-v1"
    assert ev.spec.code.key == "code/ab.tar.gz" and ev.spec.code.sha256 == "ab" * 32
    assert gw.projected["deployments"] >= gw.bus.seq


async def test_lists_return_the_spec_and_the_request_as_json(gw):
    gw.pool.answer("FROM gateway.deployments WHERE workspace=$1 AND status <> 'deleted'", [
        {"deployment_id": "hello-v1", "name": "hello", "version": 1, "status": "active", "spec": spec_json()}])
    gw.pool.answer("FROM gateway.containers c LEFT JOIN", [{"container_id": "c1", "request": '{"pool": "p"}'}])
    async with client(gw) as c:
        [dep] = (await c.get("/api/v1/deployments")).json()
        assert dep["spec"]["code"]["handler"] == "hello" and dep["spec"]["resources"]["memory_mib"] == 1024
        [row] = (await c.get("/api/v1/containers")).json()
        assert row["request"] == {"pool": "p"}


async def test_the_container_list_pages_and_says_how_many_there_are(gw):
    gw.pool.answer("SELECT count(*) FROM gateway.containers", [{"count": 2500}])
    gw.pool.answer("FROM gateway.containers c LEFT JOIN", [{"container_id": "c1", "request": None}])
    async with client(gw) as c:
        r = await c.get("/api/v1/containers", params={"all": "true", "limit": 2, "offset": 1000})
        assert r.status_code == 200 and r.headers["X-Total-Count"] == "2500"
        assert "LIMIT $3 OFFSET $4" in gw.pool.queries[-1]
        for bad in ({"limit": 0}, {"limit": 10001}, {"offset": -1}):
            assert (await c.get("/api/v1/containers", params=bad)).status_code == 422, bad


async def test_a_worker_fetches_code_only_for_a_container_placed_on_it(gw, monkeypatch):
    class S3:
        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return None

        async def get_object(self, Bucket, Key):
            assert (Bucket, Key) == ("levers9-default", "code/ab.tar.gz")

            class Body:
                async def read(self):
                    return b"tar bytes"
            return {"Body": Body()}

    monkeypatch.setattr(routes_internal, "s3_client", lambda settings: S3())
    url = "/api/v1/internal/deployments/hello-v1/code?workspace=default&container_id=c1&seq=7"
    gw.projected["containers"] = gw.bus.last_container_seq = 7
    spec = json.loads(spec_json())
    spec["code"]["key"] = "code/ab.tar.gz"
    gw.pool.answer("SELECT c.worker_id, d.spec", [{"worker_id": "w2", "spec": json.dumps(spec)}])
    async with client(gw) as c:
        r = await c.get(url)
        assert r.status_code == 403 and r.json()["detail"] == "only a worker token can fetch code archives"
    async with client(gw, WORKER) as c:
        r = await c.get(url)
        assert r.status_code == 404 and r.json()["detail"] == "container c1 is not placed on worker w1"
        gw.pool.answer("SELECT c.worker_id, d.spec", [{"worker_id": "w1", "spec": json.dumps(spec)}])
        r = await c.get(url)
        assert r.status_code == 200 and r.content == b"tar bytes"
        r = await c.get(url.replace("&seq=7", ""))  # an older worker: waits for the container's last event
        assert r.status_code == 200 and gw.bus.filters == ["levers9.default.container.c1.*"]
        assert (await c.get(url.replace("&seq=7", "&seq=0"))).status_code == 200 and len(gw.bus.filters) == 2


async def test_a_call_resolves_its_version_and_asks_for_a_container_restoring_the_newest_checkpoint(gw):
    dep = {"workspace": "default", "deployment_id": "hello-v2", "name": "hello", "version": 2, "status": "active",
           "spec": spec_json(timeout_seconds=1, checkpoint_enabled=True)}
    gw.pool.answer("AND version=$3", [{**dep, "deployment_id": "hello-v1", "version": 1, "status": "stopped"}])
    gw.pool.answer("AND status='active' ORDER BY version DESC", [dep])
    gw.pool.answer("FROM gateway.checkpoints", [
        {"checkpoint_id": "ck2", "accelerator": "", "sha256": "s", "size_bytes": 5, "bucket": "b", "key": "k",
         "location": "http://node"}])
    async with client(gw) as c:
        r = await c.post("/endpoint/hello/v1/x")
        assert r.status_code == 410 and r.json()["detail"] == "endpoint 'hello' version 1 is stopped"
        gw.pool.answer("AND version=$3", [])
        r = await c.post("/endpoint/hello/v9")
        assert r.status_code == 404 and "no endpoint 'hello' v9 in workspace 'default'" in r.json()["detail"]
        r = await c.post("/endpoint/hello/latest/x", json={})  # nothing becomes ready within the 1 s timeout
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
    [ev] = gw.bus.events()
    assert isinstance(ev, E.ContainerRequested) and ev.deployment_id == "hello-v2" and ev.deployment_version == 2
    assert ev.checkpoint is not None and ev.checkpoint.checkpoint_id == "ck2"
    assert ev.checkpoint.location == "http://node" and ev.note == ""
    assert ev.spec is not None and ev.spec.timeout_seconds == 1
    assert gw.bus.published[0].correlation_id == r.json()["correlation_id"]


async def test_a_worker_without_the_keyring_gets_only_its_placed_containers_named_secrets(gw):
    from levers9.runtime import sealing
    from levers9.runtime.secrets import encrypt

    ring = sealing.dump_keyring(sealing.rotated(None))
    gw.settings = gw.settings.with_(secret_key=ring)
    gw.projected["containers"] = gw.bus.last_container_seq = 7
    spec = json.loads(spec_json(secrets=["API_KEY"]))
    gw.pool.answer("SELECT c.worker_id, d.spec", [{"worker_id": "w1", "spec": json.dumps(spec)}])
    gw.pool.answer("FROM gateway.secrets", [{"name": "API_KEY",
                                             "ciphertext": encrypt(gw.settings, "default", "API_KEY", "s3cr3t")}])
    url = "/api/v1/internal/deployments/hello-v1/secrets"
    asked = {"workspace": "default", "container_id": "c1", "seq": 7, "names": ["API_KEY"]}
    async with client(gw) as c:
        assert (await c.get(url, params=asked)).status_code == 403  # a user token
    async with client(gw, WORKER) as c:
        r = await c.get(url, params=asked)
        assert r.status_code == 200 and r.json() == {"API_KEY": "s3cr3t"}
        r = await c.get(url, params={**asked, "names": ["API_KEY", "DB_PASSWORD"]})
        assert r.status_code == 403 and "DB_PASSWORD" in r.json()["detail"] and "s3cr3t" not in r.text
        gw.pool.answer("SELECT c.worker_id, d.spec", [{"worker_id": "w2", "spec": json.dumps(spec)}])
        r = await c.get(url, params=asked)  # placed on another worker
        assert r.status_code == 404 and "not placed on worker w1" in r.json()["detail"]


async def test_a_worker_without_the_keyring_gets_the_data_key_of_its_placed_deployments_checkpoint_only(
        gw, monkeypatch):
    from levers9.runtime import sealing
    from levers9.runtime.secrets import checkpoint_context

    ring = sealing.rotated(None)
    gw.settings = gw.settings.with_(secret_key=sealing.dump_keyring(ring))
    archive = sealing.seal_archive(ring, b"a criu dump" * 1000, checkpoint_context("levers9-default", "ck/1.tar"))
    ranges = []

    class S3:
        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return None

        async def get_object(self, Bucket, Key, Range):
            assert (Bucket, Key) == ("levers9-default", "ck/1.tar")
            ranges.append(Range)
            end = int(Range.split("-")[1]) + 1

            class Body:
                async def __aenter__(self):
                    return self

                async def __aexit__(self, *exc):
                    return None

                async def read(self):
                    return archive[:end]
            return {"Body": Body()}

    monkeypatch.setattr(routes_internal, "s3_client", lambda settings: S3())
    gw.projected["containers"] = gw.bus.last_container_seq = 7
    gw.pool.answer("SELECT c.worker_id, d.spec", [{"worker_id": "w1", "spec": spec_json()}])
    gw.pool.answer("FROM gateway.checkpoints WHERE workspace=$1 AND checkpoint_id=$2",
                   [{"deployment_id": "hello-v1", "bucket": "levers9-default", "key": "ck/1.tar"}])
    url = "/api/v1/internal/deployments/hello-v1/checkpoint-key"
    asked = {"workspace": "default", "container_id": "c1", "seq": 7, "checkpoint_id": "ck1"}
    async with client(gw) as c:
        assert (await c.get(url, params=asked)).status_code == 403  # a user token
    async with client(gw, WORKER) as c:
        r = await c.get(url, params=asked)
        assert r.status_code == 200, r.text
        key = base64.b64decode(r.json()["data_key"])
        # the key opens that archive (and the keyring's KEK was never sent)
        opener = sealing.ArchiveOpener(None, checkpoint_context("levers9-default", "ck/1.tar"), key)
        assert opener.update(archive) + opener.finish() == b"a criu dump" * 1000
        assert ranges == [f"bytes=0-{sealing.HEADER_MAX - 1}"]
        r = await c.get(url.replace("hello-v1", "other-v1"), params=asked)  # not the checkpoint's deployment
        assert r.status_code == 404
        gw.pool.answer("SELECT c.worker_id, d.spec", [{"worker_id": "w2", "spec": spec_json()}])
        r = await c.get(url, params=asked)  # its container is placed on another worker
        assert r.status_code == 404 and "not placed on worker w1" in r.json()["detail"]


def hello_v1_with_nothing_listening(gw: GatewayService, timeout_seconds: int) -> str:
    """Deployment hello-v1 is active; the answer is an address of a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        ended = f"http://127.0.0.1:{s.getsockname()[1]}"
    dep = {"workspace": "default", "deployment_id": "hello-v1", "name": "hello", "version": 1, "status": "active",
           "spec": spec_json(timeout_seconds=timeout_seconds)}
    gw.pool.answer("AND status='active' ORDER BY version DESC", [dep])
    return ended


async def test_a_call_to_a_container_that_refuses_the_connection_goes_to_another_one(gw):
    """A container that ended before the gateway heard of it refuses the connection: the call was never
    delivered, so it is sent to another ready container, and the refusing one takes no more calls."""
    from aiohttp import ClientSession, web

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"body": (await request.read()).decode()})

    app = web.Application()
    app.router.add_post("/x", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    alive = f"http://127.0.0.1:{runner.addresses[0][1]}"
    ended = hello_v1_with_nothing_listening(gw, timeout_seconds=5)
    gw.pool.answer("AND deployment_id=$2 AND status NOT IN", [
        {"container_id": "c-ended", "status": "ready", "address": ended},
        {"container_id": "c-alive", "status": "ready", "address": alive}])
    gw.session = ClientSession()
    try:
        async with client(gw) as c:
            for n in range(2):
                r = await c.post("/endpoint/hello/x", content=f"call {n}")
                assert r.status_code == 200, r.text
                assert r.json() == {"body": f"call {n}"} and r.headers["x-levers9-container-id"] == "c-alive"
        router = gw.routers["default/hello-v1"]
        assert list(router.containers) == ["c-alive"] and router.containers["c-alive"].inflight == 0
        assert gw.bus.events() == []  # no new container was asked for
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_a_call_whose_every_container_refuses_the_connection_fails_with_502_and_why(gw):
    from aiohttp import ClientSession

    ended = hello_v1_with_nothing_listening(gw, timeout_seconds=1)
    gw.pool.answer("AND deployment_id=$2 AND status NOT IN",
                   [{"container_id": f"c{n}", "status": "ready", "address": ended} for n in range(4)])
    gw.session = ClientSession()
    try:
        async with client(gw) as c:
            r = await c.post("/endpoint/hello", content="x")
        assert r.status_code == 502 and "did not answer: ClientConnectorError" in r.json()["detail"]
        assert r.json()["correlation_id"] and gw.routers["default/hello-v1"].containers == {}
    finally:
        await gw.session.close()


async def test_a_container_that_takes_the_call_and_drops_it_answers_502_with_the_correlation_id(gw):
    """The call was delivered and may have run: it is not sent again, and the 502 says why and which
    correlation id the gateway's log lines of this call carry."""
    import asyncio

    from aiohttp import ClientSession

    dep_address = hello_v1_with_nothing_listening(gw, timeout_seconds=5)

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()
    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    address = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    assert address != dep_address
    gw.pool.answer("AND deployment_id=$2 AND status NOT IN", [{"container_id": "c1", "status": "ready",
                                                                "address": address}])
    gw.session = ClientSession()
    try:
        async with client(gw) as c:
            r = await c.post("/endpoint/hello", content="x")
        assert r.status_code == 502 and "did not answer: ServerDisconnectedError" in r.json()["detail"]
        assert r.json()["correlation_id"]
        assert gw.bus.events() == []  # not sent to another container
    finally:
        await gw.session.close()
        server.close()


async def test_a_call_whose_connection_is_reset_before_any_byte_is_sent_again_on_a_fresh_one(gw):
    """A kept-alive connection the container dropped: the call goes once more, to the same container,
    on a connection of its own, and is answered; no other container is asked for."""
    import asyncio

    from aiohttp import ClientSession

    hello_v1_with_nothing_listening(gw, timeout_seconds=5)
    seen: list[int] = []

    async def first_dropped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        seen.append(1)
        if len(seen) > 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        writer.close()
    server = await asyncio.start_server(first_dropped, "127.0.0.1", 0)
    address = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    gw.pool.answer("AND deployment_id=$2 AND status NOT IN", [{"container_id": "c1", "status": "ready",
                                                                "address": address}])
    gw.session = ClientSession()
    try:
        async with client(gw) as c:
            r = await c.post("/endpoint/hello", content="x")
        assert r.status_code == 200 and r.text == "ok" and len(seen) == 2
        assert r.headers["x-levers9-container-id"] == "c1" and gw.bus.events() == []
    finally:
        await gw.session.close()
        server.close()
