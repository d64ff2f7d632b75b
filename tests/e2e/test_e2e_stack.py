"""The whole stack, as a user runs it: `levers9 up`, status, a hand-written event from a plain NATS
client, the DLQ, replay, a projection rebuild, SIGKILL of a service while events flow, `down`.

One stack for the module (started by the real CLI in a temporary LEVERS9_HOME)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import tomllib
import uuid
from pathlib import Path

import asyncpg
import httpx
import nats
import psutil
import pytest
from _e2e import bus_auth, cli, wait_until

from levers9.contracts import envelope, subjects, uuid7
from levers9.contracts import events as E
from levers9.runtime.bus import Bus
from levers9.runtime.bus_auth import BusAuth
from levers9.runtime.config import SERVICES, Settings
from levers9.stack import Stack
from levers9.stack.home import PROCESSES

pytestmark = pytest.mark.slow




def processes_of(home: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            env = p.info["environ"] or {}
        except psutil.Error:
            continue
        if str(home) in cmd or env.get("LEVERS9_HOME") == str(home):
            out.append(p)
    return [p for p in out if p.pid != os.getpid()]


@pytest.fixture(scope="module")
def stack_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("l9home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    env["LEVERS9_HOME"] = str(home)
    try:
        cli(env, "up")
        yield env
    finally:
        cli(env, "down", check=False)


@pytest.fixture(scope="module")
def state(stack_env) -> dict:
    return json.loads((Path(stack_env["LEVERS9_HOME"]) / "state.json").read_text())


def run(coro):
    return asyncio.run(coro)


def test_up_reports_ten_healthy_components_and_writes_the_profile(stack_env):
    doc = json.loads(cli(stack_env, "status", "--json").stdout)
    names = [c["name"] for c in doc["components"]]
    assert names == ["nats", "postgres", "s3", "registry", *PROCESSES]
    assert all(c["healthy"] for c in doc["components"]), doc
    assert doc["gateway_url"].startswith("http://127.0.0.1:")
    profile = tomllib.loads((Path(stack_env["LEVERS9_HOME"]) / "config.toml").read_text())
    assert profile["gateway_url"] == doc["gateway_url"] and profile["token"].startswith("l9_")
    r = httpx.get(f"{profile['gateway_url']}/api/v1/whoami", headers={"Authorization": f"Bearer {profile['token']}"})
    assert r.status_code == 200 and r.json()["workspace"] == "default"
    assert httpx.get(f"{profile['gateway_url']}/api/v1/whoami",
                     headers={"Authorization": "Bearer l9_wrong"}).status_code == 401
    assert httpx.get(f"{profile['gateway_url']}/api/v1/whoami").status_code == 401
    metrics = httpx.get(f"{profile['gateway_url']}/metrics").text
    assert "levers9_events_consumed_total" in metrics


def test_a_second_up_starts_nothing(stack_env):
    proc = cli(stack_env, "up")
    assert "nothing started" in proc.stderr


async def _scheduler_row(database_url: str, container_id: str):
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetchrow("SELECT * FROM scheduler.containers WHERE container_id = $1", container_id)
    finally:
        await conn.close()




def test_hand_written_json_from_a_plain_nats_client_is_handled_like_the_gateways(stack_env, state):
    cid = str(uuid.uuid4())
    corr = str(uuid.uuid4())
    doc = {"id": str(uuid.uuid4()), "type": "ContainerRequested", "version": 2,
           "occurred_at": "2026-12-02T12:00:00.000000Z", "workspace": "default", "correlation_id": corr,
           "causation_id": None, "data": {"container_id": cid, "cpu_millicores": 250, "memory_mib": 128}}

    # another system's client, with publisher credentials of workspace `default` (README)
    creds = Path(stack_env["LEVERS9_HOME"]) / "default-publisher.creds"
    cli(stack_env, "publishers", "create", "--workspace", "default", "--out", str(creds))

    async def publish():
        nc = await nats.connect(state["nats_url"], **BusAuth(creds=str(creds)).connect_options())
        js = nc.jetstream()
        ack = await js.publish(f"levers9.default.container.{cid}.ContainerRequested", json.dumps(doc).encode(),
                               headers={"Nats-Msg-Id": doc["id"]})
        await nc.close()
        return ack

    run(publish())
    row = wait_until(lambda: run(_scheduler_row(state["database_url"], cid)))
    assert row["cpu_millicores"] == 250 and row["correlation_id"] == corr
    lines = cli(stack_env, "events", "replay", "--json", "--correlation-id", corr).stdout.splitlines()
    story = [json.loads(line) for line in lines]
    assert story[0]["id"] == doc["id"] and story[0]["data"]["container_id"] == cid
    assert all(e["data"]["container_id"] == cid for e in story)  # what followed (placement) is in it too
    table = cli(stack_env, "events", "replay", "--aggregate", "container", "--aggregate-id", cid).stdout
    assert "ContainerRequested" in table
    token = tomllib.loads((Path(stack_env["LEVERS9_HOME"]) / "config.toml").read_text())["token"]
    r = httpx.get(f"{state['gateway_url']}/api/v1/containers/{cid}", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and r.json()["container_id"] == cid and r.json()["cpu_millicores"] == 250


def test_a_malformed_message_lands_in_the_dlq_with_its_reason(stack_env, state):
    subject = f"levers9.default.container.{uuid.uuid4()}.ContainerRequested"

    async def go():
        nc = await nats.connect(state["nats_url"], **bus_auth(stack_env).connect_options())
        js = nc.jetstream()
        await js.publish(subject, b'{"type": "ContainerRequested", "version": 2}', headers={"Nats-Msg-Id": uuid7()})
        deadline = time.monotonic() + 20
        sub = await js.subscribe(f"levers9dlq.{subject}", ordered_consumer=True)
        try:
            while time.monotonic() < deadline:
                try:
                    return await sub.next_msg(timeout=1)
                except nats.errors.TimeoutError:
                    continue
        finally:
            await nc.close()

    dead = run(go())
    assert dead is not None
    assert dead.headers["Levers9-Original-Subject"] == subject
    assert "does not decode" in dead.headers["Levers9-Reason"]
    assert dead.headers["Levers9-Consumer"]


def test_gateway_api_requests_a_container_and_other_workspaces_see_404(stack_env, state):
    token = tomllib.loads((Path(stack_env["LEVERS9_HOME"]) / "config.toml").read_text())["token"]
    auth = {"Authorization": f"Bearer {token}"}
    r = httpx.post(f"{state['gateway_url']}/api/v1/containers", json={"cpu_millicores": 500, "memory_mib": 256}, headers=auth)
    assert r.status_code == 202, r.text
    cid = r.json()["container_id"]
    assert httpx.post(f"{state['gateway_url']}/api/v1/containers", json={"cpu_millicores": -1}, headers=auth).status_code == 422
    other = "l9_" + uuid.uuid4().hex

    async def token_for_other():
        from levers9.cli import publish_token
        await publish_token(state["nats_url"], other, "test", workspace="other", auth=bus_auth(stack_env))

    run(token_for_other())
    other_auth = {"Authorization": f"Bearer {other}"}
    wait_until(lambda: httpx.get(f"{state['gateway_url']}/api/v1/whoami", headers=other_auth).status_code == 200)
    wait_until(lambda: httpx.get(f"{state['gateway_url']}/api/v1/containers/{cid}", headers=auth).status_code == 200)
    assert httpx.get(f"{state['gateway_url']}/api/v1/containers/{cid}", headers=other_auth).status_code == 404
    corr = r.json()["correlation_id"]
    lines = cli(stack_env, "events", "replay", "--json", "--correlation-id", corr).stdout.splitlines()
    assert [json.loads(x)["type"] for x in lines][0] == "ContainerRequested"
    assert {json.loads(x)["data"]["container_id"] for x in lines} == {cid}


def test_rebuilt_projection_equals_the_live_one(stack_env):
    report = json.loads(cli(stack_env, "projections", "rebuild", "scheduler", "--json").stdout)
    assert report["equal"] and report["swapped"], report
    assert {t["table"] for t in report["tables"]} == {"containers", "workers", "worker_slots", "clusters",
                                                      "cluster_shares", "cluster_workers"}
    assert all(t["live_rows"] == t["rebuilt_rows"] for t in report["tables"])
    doc = json.loads(cli(stack_env, "status", "--json").stdout)
    assert all(c["healthy"] for c in doc["components"])


async def _versions(database_url: str, schema: str, prefix: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(f"SELECT container_id, version FROM {schema}.containers WHERE container_id LIKE $1",
                                prefix + "%")
        return {r["container_id"]: r["version"] for r in rows}
    finally:
        await conn.close()


@pytest.mark.parametrize("victim", ["scheduler", "gateway", "worker"])
def test_sigkill_of_a_service_while_events_flow_loses_nothing_and_applies_nothing_twice(stack_env, state, victim):
    """Each container gets exactly 40 events; after a SIGKILL mid-stream and a restart by `levers9 up`,
    the victim's projection must show version == 40 for each (a lost event: < 40; a double apply: > 40).
    The events (started on a worker nobody runs, stop requested) are ones no service reacts to, so
    nothing but the test adds to these containers."""
    prefix = f"k{victim[:3]}{uuid.uuid4().hex[:6]}-"
    containers = [f"{prefix}{i}" for i in range(10)]
    schema = victim.replace("-", "_")

    progress = {"sent": 0}

    async def flow(stop_at: int):
        bus = await Bus.connect(state["nats_url"], auth=bus_auth(stack_env))
        for round_ in range(stop_at):
            for cid in containers:
                event = (E.ContainerStarted(container_id=cid, worker_id="nobody") if round_ % 2 == 0
                         else E.ContainerStopRequested(container_id=cid, reason="test"))
                await bus.publish(envelope(event, workspace="default"))
                progress["sent"] += 1
            await asyncio.sleep(0.02)
        await bus.close()
        return progress["sent"]

    result: dict[str, int] = {}
    publisher = threading.Thread(target=lambda: result.setdefault("sent", run(flow(40))))
    publisher.start()
    # kill only once the victim is seen applying this flow, and well before the flow ends
    wait_until(lambda: sum(run(_versions(state["database_url"], schema, prefix)).values()) >= 20, timeout=60,
               every=0.02)
    assert progress["sent"] < 400, "the flow ended before the kill: the test would prove nothing"
    settings = Settings.load(env={"LEVERS9_HOME": stack_env["LEVERS9_HOME"]})
    Stack(Path(stack_env["LEVERS9_HOME"]), settings).kill_service(victim)
    cli(stack_env, "up")  # restarts the killed service
    publisher.join(timeout=120)
    assert result["sent"] == 400
    expected = {cid: 40 for cid in containers}
    wait_until(lambda: run(_versions(state["database_url"], schema, prefix)) == expected, timeout=60)
    # nothing more arrives late: the victim's projection has passed the end of the log as it was
    last = run(_last_container_seq(state["nats_url"], stack_env))
    wait_until(lambda: run(_position(state["database_url"], schema, "containers")) >= last, timeout=60)
    assert run(_versions(state["database_url"], schema, prefix)) == expected


async def _last_container_seq(nats_url: str, env: dict) -> int:
    bus = await Bus.connect(nats_url, auth=bus_auth(env))
    try:
        return await bus.last_seq(subjects.filter_subject(aggregate="container"))
    finally:
        await bus.close()


async def _position(database_url: str, schema: str, projection: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval(f"SELECT seq FROM {schema}.positions WHERE projection = $1", projection) or 0)
    finally:
        await conn.close()


def test_down_leaves_no_process_and_a_second_up_keeps_the_data(stack_env):
    home = Path(stack_env["LEVERS9_HOME"])
    before = cli(stack_env, "events", "replay", "--json").stdout.count("\n")
    down = cli(stack_env, "down")
    assert processes_of(home) == []
    for name in SERVICES:  # SIGTERM is graceful: each finished its work in hand and said so
        log = (home / "logs" / f"{name}.log").read_text()
        assert f'"msg": "{name} stopped"' in log.splitlines()[-1] or f'"{name} stopped"' in log, \
            (name, down.stdout + down.stderr)
    status = cli(stack_env, "status", "--json", check=False)
    assert status.returncode == 1
    assert not any(c["healthy"] for c in json.loads(status.stdout)["components"])
    cli(stack_env, "up")
    after = cli(stack_env, "events", "replay", "--json").stdout.count("\n")
    assert after >= before > 0
