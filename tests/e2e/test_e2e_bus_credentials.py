"""Credentials on the bus, against a real `levers9 up` (NATS in operator mode, every service with its
own user): no credentials → refused; a publisher writes only requests into its own workspace; a
forged TokenCreated is refused by the server, and one that reaches the stream unsigned or badly
signed is dead-lettered and never makes a token valid; a worker writes only its own subjects.

One stack for the module (the real CLI in a temporary LEVERS9_HOME)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import tomllib
import uuid
from pathlib import Path

import httpx
import nats
import nats.errors
import nats.js.errors
import pytest
from _e2e import cli, wait_until

from levers9.contracts import encode, envelope, uuid7
from levers9.contracts import events as E
from levers9.runtime import nats_jwt
from levers9.runtime.bus_auth import BusAuth
from levers9.runtime.bus_signing import SIGNATURE_HEADER, SIGNER_HEADER, Reporter, Signer
from levers9.runtime.config import Settings
from levers9.runtime.nats_auth import inbox_prefix, worker_tag
from levers9.runtime.nats_issuer import Issuer
from levers9.runtime.tokens import mint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("l9bus")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    env["LEVERS9_HOME"] = str(home)
    try:
        cli(env, "up")
        state = json.loads((home / "state.json").read_text())
        profile = tomllib.loads((home / "config.toml").read_text())
        yield {"env": env, "home": home, "nats_url": state["nats_url"], "gateway_url": profile["gateway_url"],
               "issuer": Issuer(home / "nats" / "auth")}
    finally:
        cli(env, "down", check=False)


def run(coro):
    return asyncio.run(coro)


class Client:
    """A plain nats-py client with a creds file; collects the errors the server sends it."""

    def __init__(self, url: str, creds: str | None) -> None:
        self.url, self.creds = url, creds
        self.errors: list[str] = []
        self.nc: nats.NATS | None = None

    async def __aenter__(self) -> "Client":
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc).lower())

        opts = BusAuth(creds=self.creds).connect_options() if self.creds else {}
        self.nc = await nats.connect(self.url, allow_reconnect=False, error_cb=on_error, **opts)
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.nc is not None
        await self.nc.close()

    async def refused(self, subject: str, payload: bytes = b"{}", headers: dict | None = None) -> bool:
        """Publish; True once the server answers with a permissions violation naming `subject`."""
        assert self.nc is not None
        await self.nc.publish(subject, payload, headers=headers)
        await self.nc.flush()
        for _ in range(100):  # the violation comes back asynchronously; a flush round trip orders it
            if any("permissions violation" in e and subject.lower() in e for e in self.errors):
                return True
            await asyncio.sleep(0.05)
            await self.nc.flush()
        return False

    async def accepted(self, subject: str, payload: bytes, headers: dict | None = None) -> int:
        assert self.nc is not None
        ack = await self.nc.jetstream().publish(subject, payload, headers={"Nats-Msg-Id": uuid7(), **(headers or {})},
                                                timeout=10)
        return ack.seq


def publisher_creds(stack, workspace: str, tmp_path: Path) -> str:
    path = tmp_path / f"{workspace}.creds"
    doc = json.loads(cli(stack["env"], "publishers", "create", "--workspace", workspace, "--out", str(path),
                         "--json").stdout)
    assert doc["workspace"] == workspace and doc["creds"] is None and path.stat().st_mode & 0o077 == 0
    assert doc["inbox_prefix"] == f"_INBOX_p_{workspace}_{doc['id']}"
    return str(path)


def whoami(stack, token: str) -> int:
    return httpx.get(f"{stack['gateway_url']}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}).status_code


async def _dlq_reason(url: str, admin: str, subject: str) -> str | None:
    async with Client(url, admin) as c:
        assert c.nc is not None
        try:
            msg = await c.nc.jetstream().get_last_msg("LEVERS9_DLQ", f"levers9dlq.{subject}")
        except nats.js.errors.NotFoundError:
            return None
        headers = msg.headers or {}
        return f"{headers.get('Levers9-Consumer')}: {headers.get('Levers9-Reason')}"


def test_a_connection_without_credentials_is_refused(stack):
    async def go():
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(stack["nats_url"], allow_reconnect=False, max_reconnect_attempts=0)

    run(go())


def test_a_publisher_writes_requests_into_its_workspace_only(stack, tmp_path):
    creds = publisher_creds(stack, "pubws", tmp_path)
    cid = str(uuid.uuid4())
    req = encode(envelope(E.ContainerRequested(container_id=cid), workspace="pubws"))

    async def go():
        async with Client(stack["nats_url"], creds) as c:
            assert await c.accepted(f"levers9.pubws.container.{cid}.ContainerRequested", req) > 0
            assert await c.refused(f"levers9.other.container.{cid}.ContainerRequested", req)
            assert await c.refused(f"levers9.pubws.container.{cid}.ContainerStarted")  # a fact, not a request
            assert await c.refused("levers9._sys.worker.w1.WorkerRegistered")
            assert await c.refused("$JS.API.STREAM.DELETE.LEVERS9")
        async with Client(stack["nats_url"], str(stack["issuer"].creds_path("admin"))) as admin:
            assert admin.nc is not None
            with pytest.raises(nats.js.errors.NotFoundError):  # the refused one never reached the log
                await admin.nc.jetstream().get_last_msg("LEVERS9", f"levers9.other.container.{cid}.ContainerRequested")

    run(go())
    listed = json.loads(cli(stack["env"], "publishers", "list", "--json").stdout)
    assert any(p["workspace"] == "pubws" and not p["revoked_at"] for p in listed)


def test_a_publishers_forged_token_is_refused_by_the_server(stack, tmp_path):
    creds = publisher_creds(stack, "default", tmp_path)
    minted = mint(name="forged")
    env = envelope(minted.event, workspace="default")

    async def go():
        async with Client(stack["nats_url"], creds) as c:
            assert await c.refused(env.subject, encode(env), {"Nats-Msg-Id": env.id})

    run(go())
    assert whoami(stack, minted.secret) == 401


@pytest.mark.parametrize("how", ["unsigned", "signed by a key that is not the gateway's", "scheduler's name"])
def test_a_token_that_reaches_the_stream_without_its_owners_signature_is_dead_lettered(stack, how):
    """Injected with the admin's credentials (the server lets those through) but without the
    gateway's valid signature: the gateway's consumer dead-letters it; the token never works."""
    minted = mint(name=f"injected {how}")
    env = envelope(minted.event, workspace="default")
    payload = encode(env)
    headers = {"unsigned": {},
               "signed by a key that is not the gateway's": Signer("gateway", nats_jwt.new_seed("user")).headers(
                   env.subject, payload),
               "scheduler's name": {SIGNER_HEADER: "scheduler", SIGNATURE_HEADER: "AAAA"}}[how]
    admin = str(stack["issuer"].creds_path("admin"))

    async def go():
        async with Client(stack["nats_url"], admin) as c:
            await c.accepted(env.subject, payload, headers)

    run(go())
    reason = wait_until(lambda: run(_dlq_reason(stack["nats_url"], admin, env.subject)), timeout=30)
    assert reason.startswith("gateway") and "power event TokenCreated" in reason, reason  # the gateway's view
    assert whoami(stack, minted.secret) == 401


def test_a_token_signed_by_its_owner_is_accepted(stack):
    """The control for the test above: the same path, signed with the admin's key, grants the token."""
    from levers9.cli import publish_event

    minted = mint(name="signed")
    auth = BusAuth.from_settings(Settings.load(env={"LEVERS9_HOME": str(stack["home"])}))
    assert auth.signer is not None and auth.signer.role == "admin"
    run(publish_event(stack["nats_url"], minted.event, "default", auth))
    wait_until(lambda: whoami(stack, minted.secret) == 200, timeout=30)


def test_a_worker_writes_only_its_own_subjects(stack):
    creds = str(stack["issuer"].worker_creds("wtest"))
    cid = str(uuid.uuid4())
    started = encode(envelope(E.ContainerStarted(container_id=cid, worker_id="wtest"), workspace="default"))

    async def go():
        async with Client(stack["nats_url"], creds) as c:
            assert c.nc is not None
            assert await c.accepted(f"levers9.default.container.{cid}.ContainerStarted", started) > 0
            assert await c.refused("levers9._sys.worker.other.WorkerReady")
            assert await c.refused("levers9._sys.worker.wtest.WorkerSlotReserved")
            assert await c.refused(f"levers9.default.container.{cid}.ContainerScheduled")
            assert await c.refused("levers9.default.token.t1.TokenCreated")
            assert await c.refused("$KV.levers9_heartbeats.other")
            assert await c.refused("$JS.API.STREAM.DELETE.LEVERS9")
            await c.nc.subscribe("_INBOX.>")  # another user's replies: refused too
            await c.nc.flush()
            wait = 0
            while not any("permissions violation for subscription" in e for e in c.errors) and wait < 100:
                await asyncio.sleep(0.05)
                wait += 1
            assert any("permissions violation for subscription" in e for e in c.errors), c.errors

    run(go())
    assert inbox_prefix(worker_tag("wtest")) == "_INBOX_w_wtest"


def _api(stack, method: str, path: str, **kw) -> httpx.Response:
    token = tomllib.loads((stack["home"] / "config.toml").read_text())["token"]
    return httpx.request(method, f"{stack['gateway_url']}{path}", headers={"Authorization": f"Bearer {token}"},
                         timeout=30, **kw)


def test_a_worker_cannot_report_on_a_container_placed_on_another_worker(stack):
    """Server permissions cannot name container ids, so the consumers bind each report to its sender
    (the worker's own NATS user signs it) and to the container's placement."""
    r = _api(stack, "POST", "/api/v1/containers", json={"cpu_millicores": 100, "memory_mib": 64})
    assert r.status_code == 202, r.text
    cid = r.json()["container_id"]
    row = wait_until(lambda: (c := _api(stack, "GET", f"/api/v1/containers/{cid}").json()).get("worker_id") and c,
                     timeout=120)
    placed = row["worker_id"]
    creds = str(stack["issuer"].worker_creds("wtest"))
    admin = str(stack["issuer"].creds_path("admin"))
    subject = f"levers9.default.container.{cid}.ContainerReady"

    def ready(worker_id: str) -> bytes:
        return encode(envelope(E.ContainerReady(container_id=cid, worker_id=worker_id, address="http://198.51.100.7:1"),
                               workspace="default"))

    async def go(payload: bytes, signed: bool) -> None:
        async with Client(stack["nats_url"], creds) as c:
            headers = Reporter.from_creds(creds).headers(subject, payload) if signed else {}
            await c.accepted(subject, payload, headers)

    run(go(ready(placed), signed=False))  # claims to be the placed worker, unsigned
    reason = wait_until(lambda: run(_dlq_reason(stack["nats_url"], admin, subject)), timeout=30)
    assert "unsigned container report ContainerReady" in reason, reason
    run(go(ready(placed), signed=True))  # signed as itself while naming the placed worker
    wait_until(lambda: "was sent by worker 'wtest'" in (run(_dlq_reason(stack["nats_url"], admin, subject)) or ""),
               timeout=30)
    run(go(ready("wtest"), signed=True))  # honest about itself, but the container is not placed on it
    time.sleep(3)  # nothing to wait for: it must change nothing
    after = _api(stack, "GET", f"/api/v1/containers/{cid}").json()
    assert after["worker_id"] == placed and "198.51.100.7" not in after.get("address", ""), after

    # a checkpoint of that container handed in by wtest (signed as itself): the store refuses it
    ck = str(uuid.uuid4())
    dumped = envelope(E.CheckpointDumped(checkpoint_id=ck, deployment_id="hello-v1", container_id=cid,
                                         worker_id="wtest", size_bytes=1, sha256="0" * 64,
                                         location="http://198.51.100.7:1/blobs/x"), workspace="default")
    subject, payload = dumped.subject, encode(dumped)

    async def hand_in() -> None:
        async with Client(stack["nats_url"], creds) as c:
            await c.accepted(subject, payload, Reporter.from_creds(creds).headers(subject, payload))

    run(hand_in())
    row = wait_until(lambda: next((c for c in _api(stack, "GET", "/api/v1/checkpoints", params={"all": "true"}).json()
                                   if c["checkpoint_id"] == ck and c["status"] != "dumped"), None), timeout=60)
    assert row["status"] == "checkpoint_failed" and f"is placed on '{placed}'" in row["reason"], row


def test_a_worker_the_pool_controller_provisioned_registers_with_its_own_user(stack):
    """The build pool's warm worker is started by the pool controller with a user minted for it:
    its WorkerRegistered/WorkerReady (power events, signed with the workers' key) are applied."""
    token = tomllib.loads((stack["home"] / "config.toml").read_text())["token"]

    def build_worker() -> str:
        r = httpx.get(f"{stack['gateway_url']}/api/v1/workers", headers={"Authorization": f"Bearer {token}"})
        return next((w["worker_id"] for w in r.json() if w["worker_id"].startswith("build-")
                     and w["status"] == "ready"), "")

    worker_id = wait_until(build_worker, timeout=120)
    creds = stack["home"] / "nats" / "auth" / "workers" / f"{worker_id}.creds"
    claims = nats_jwt.decode(nats_jwt.creds_jwt(creds.read_text()))
    assert claims["name"] == worker_tag(worker_id)
    assert f"levers9._sys.worker.{worker_id}.>" in claims["nats"]["pub"]["allow"]


def test_a_revoked_publisher_is_refused_and_its_open_connection_cut(stack, tmp_path):
    creds = publisher_creds(stack, "gone", tmp_path)
    pid = nats_jwt.decode(nats_jwt.creds_jwt(Path(creds).read_text()))["name"].rsplit("_", 1)[-1]

    async def cut_when_revoked() -> float:
        async with Client(stack["nats_url"], creds) as c:  # connected, and publishing, before the revoke
            assert c.nc is not None
            await c.nc.publish("levers9.gone.deployment.d1.DeploymentStopped", b"{}")
            await c.nc.flush()
            t = asyncio.get_running_loop().time()
            await asyncio.to_thread(cli, stack["env"], "publishers", "revoke", pid)
            for _ in range(200):
                if c.nc.is_closed:
                    return asyncio.get_running_loop().time() - t
                await asyncio.sleep(0.1)
            raise AssertionError(f"the revoked publisher's connection is still open 20 s later: {c.errors}")

    cut_s = run(cut_when_revoked())
    print(f"\nrevoked publisher's open connection closed by the server {cut_s:.2f} s after `revoke`")

    async def connects() -> bool:
        try:
            async with Client(stack["nats_url"], creds):
                return True
        except nats.errors.Error:
            return False

    wait_until(lambda: not run(connects()), timeout=20)
    listed = json.loads(cli(stack["env"], "publishers", "list", "--json").stdout)
    assert [p["revoked_at"] > 0 for p in listed if p["id"] == pid] == [True]
