"""The event API against real NATS and Postgres: the gateway's event routes over HTTP (uvicorn), fed
by its projections applied from the real log. Another workspace's events, calls and deployments are
absent or 404 (the attack comes first); the list pages without gaps; the stream resumes by seq.

The projections live in a database of their own (created here, dropped after), so a `gateway` schema
of a real stack sharing this Postgres is never touched; every workspace and worker id is fresh.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import types
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
from _served import serving
from fastapi import FastAPI

from levers9.contracts import SYSTEM_WORKSPACE, envelope, uuid7
from levers9.contracts import events as E
from levers9.contracts.spec import Code, DeploymentSpec
from levers9.gateway import endpoint_store, event_stream, routes_calls, routes_events, routes_stats
from levers9.gateway.callers import Caller
from levers9.gateway.endpoint_meter import EndpointMeter
from levers9.gateway.views_events import CallsView, EventsView
from levers9.runtime.bus import Bus
from levers9.runtime.consumer import to_delivery
from levers9.runtime.projection import ProjectionStore
from levers9.runtime.reader import read
from levers9.runtime.tokens import token_hash
from levers9.runtime.views import CheckpointsView, ContainersView, DeploymentsView
from levers9.runtime.views_clusters import ClustersView

TAG = uuid7()[-8:]
ACME, EVIL = f"acme-{TAG}", f"evil-{TAG}"
TOKENS = {"acme-secret": ACME, "evil-secret": EVIL}
VIEWS = (EventsView(), CallsView(), DeploymentsView(), ContainersView(), CheckpointsView(), ClustersView())


@pytest.fixture(scope="module")
async def stack(servers):
    """(base url, bus, project()): the routes served over a fake gateway holding a real pool and bus."""
    admin = await asyncpg.connect(servers["database_url"])
    db = f"l9_events_{TAG}"
    await admin.execute(f"CREATE DATABASE {db}")
    pool = await asyncpg.create_pool(urlunsplit(urlsplit(servers["database_url"])._replace(path=f"/{db}")),
                                     min_size=1, max_size=4)
    store = ProjectionStore(pool, "gateway", VIEWS)
    await store.setup()
    await endpoint_store.setup(pool)
    bus = await Bus.connect(servers["nats_url"])
    await bus.ensure_topology()
    start = (await bus.js.stream_info("LEVERS9")).state.last_seq + 1

    async def project() -> None:
        for view in VIEWS:
            for f in view.filter_subjects:
                async for batch in read(bus, [f], start_seq=start):
                    await store.apply_batch(view, [to_delivery(m) for m in batch])

    gw = types.SimpleNamespace(pool=pool, bus=bus, functions=None, meter=EndpointMeter(),
                               tokens={token_hash(s): Caller(workspace=w, token_id=w, scope="workspace")
                                       for s, w in TOKENS.items()})
    app = FastAPI()
    app.state.gateway = gw
    for module in (routes_events, routes_calls, routes_stats):
        app.include_router(module.router)
    async with serving(app) as url:
        yield url, bus, project, gw
    await bus.close()
    await pool.close()
    await admin.execute(f"DROP DATABASE {db} WITH (FORCE)")
    await admin.close()


def client(url: str, secret: str = "acme-secret") -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=20)


async def publish(bus: Bus, event: E.Event, workspace: str, correlation: str | None = None) -> int:
    return (await bus.publish(envelope(event, workspace=workspace, correlation_id=correlation))).seq


@pytest.fixture(scope="module")
async def history(stack):
    """Both workspaces do the same things; a shared worker is cordoned; evil's container takes a slot."""
    url, bus, project, _ = stack
    seqs: dict[str, list[int]] = {ACME: [], EVIL: []}
    for ws in (ACME, EVIL):
        corr = f"corr-{ws}"
        for event in (E.DeploymentCreated(deployment_id=f"app-{ws}-v1", name=f"app-{ws}", version=1,
                                          spec=DeploymentSpec(name=f"app-{ws}", code=Code(module="m", handler="h"))),
                      E.ContainerRequested(container_id=f"c-{ws}", deployment_id=f"app-{ws}-v1"),
                      E.ContainerStarted(container_id=f"c-{ws}", worker_id=f"w-{TAG}", restored_from=""),
                      E.ContainerReady(container_id=f"c-{ws}", worker_id=f"w-{TAG}", address="http://x:1"),
                      E.SecretSet(name="db", ciphertext="sealed"),
                      E.FunctionCallStarted(call_id=f"call-{ws}", deployment_id=f"app-{ws}-v1", function="app.f"),
                      E.FunctionCallFinished(call_id=f"call-{ws}", deployment_id=f"app-{ws}-v1", function="app.f",
                                             outcome="error", duration_ms=12.5, error_type="ValueError")):
            seqs[ws].append(await publish(bus, event, ws, corr))
    slot = await publish(bus, E.WorkerSlotReserved(worker_id=f"w-{TAG}", container_id=f"c-{EVIL}", workspace=EVIL,
                                                   cpu_millicores=1, memory_mib=1), SYSTEM_WORKSPACE)
    cordon = await publish(bus, E.WorkerCordoned(worker_id=f"w-{TAG}"), SYSTEM_WORKSPACE)
    await project()
    return {"seqs": seqs, "slot": slot, "cordon": cordon}


async def test_another_workspaces_events_calls_and_deployments_are_absent(stack, history):
    url, _, _, _ = stack
    async with client(url) as c:
        events = (await c.get("/api/v1/events", params={"limit": 1000})).json()
        assert {e["workspace"] for e in events} == {ACME, SYSTEM_WORKSPACE}
        assert history["slot"] not in {e["seq"] for e in events}  # evil's slot names evil's container
        assert history["cordon"] in {e["seq"] for e in events}  # workers are everyone's
        assert not any(EVIL in json.dumps(e) for e in events)
        for params in ({"correlation_id": f"corr-{EVIL}"}, {"aggregate": "container", "aggregate_id": f"c-{EVIL}"}):
            assert (await c.get("/api/v1/events", params=params)).json() == []
        assert (await c.get(f"/api/v1/calls/call-{EVIL}")).status_code == 404
        assert (await c.post(f"/api/v1/calls/call-{EVIL}/cancel")).status_code == 404
        assert (await c.get(f"/api/v1/deployments/app-{EVIL}/stats")).status_code == 404
        assert [r["call_id"] for r in (await c.get("/api/v1/calls")).json()] == [f"call-{ACME}"]
        secret = next(e for e in events if e["type"] == "SecretSet")
        assert "ciphertext" not in secret["data"]
    async with client(url, "evil-secret") as c:  # and the other way round: evil sees its slot
        assert history["slot"] in {e["seq"] for e in (await c.get("/api/v1/events")).json()}


async def test_stream_shows_no_other_workspaces_event_and_resumes_by_seq(stack, history):
    url, _, _, _ = stack
    first = history["seqs"][ACME][0]
    async with client(url) as c:
        got = await read_stream(c, {"after": str(first - 1)}, until=history["cordon"])
        assert {e["workspace"] for e in got} == {ACME, SYSTEM_WORKSPACE}
        assert [e["seq"] for e in got] == sorted(history["seqs"][ACME] + [history["cordon"]])
        resumed = await read_stream(c, {}, until=history["cordon"], last_event_id=str(history["seqs"][ACME][3]))
        assert [e["seq"] for e in resumed] == [s for s in [e["seq"] for e in got] if s > history["seqs"][ACME][3]]
    async with asyncio.timeout(10):  # each stream ends (its consumer released) once its client has gone
        while routes_events._open["streams"]:
            await asyncio.sleep(0.05)


async def read_stream(c: httpx.AsyncClient, params: dict, until: int, last_event_id: str = "") -> list[dict]:
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    out: list[dict] = []
    async with asyncio.timeout(20):
        async with c.stream("GET", "/api/v1/events/stream", params=params, headers=headers) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    out.append(json.loads(line[6:]))
                    if out[-1]["seq"] >= until:
                        return out
    return out


async def test_new_events_arrive_live_and_quiet_streams_keep_alive(stack, history, monkeypatch):
    url, bus, _, _ = stack
    monkeypatch.setattr(event_stream, "KEEPALIVE_S", 0.3)
    async with client(url) as c, c.stream("GET", "/api/v1/events/stream") as r:
        lines = r.aiter_lines()
        assert (await anext(lines)).startswith("retry: ")
        seen = [await anext(lines) for _ in range(4)]
        assert ": keepalive" in seen
        seq = await publish(bus, E.ContainerStopRequested(container_id=f"c-{ACME}"), ACME)
        async with asyncio.timeout(10):
            while not (line := await anext(lines)).startswith("id: "):
                pass
        assert line == f"id: {seq}"


async def test_pages_cover_the_history_newest_first_without_gaps(stack, history):
    url, _, _, _ = stack
    async with client(url) as c:
        everything = [e["seq"] for e in (await c.get("/api/v1/events", params={"limit": 1000})).json()]
        paged, before = [], ""
        while True:
            r = await c.get("/api/v1/events", params={"limit": 3, **({"before": before} if before else {})})
            paged += [e["seq"] for e in r.json()]
            before = r.headers.get("X-Next-Before", "")
            if not before:
                break
        assert paged == everything == sorted(everything, reverse=True)
        only = (await c.get("/api/v1/events", params={"type": "ContainerReady,ContainerStarted"})).json()
        assert sorted(e["type"] for e in only) == ["ContainerReady", "ContainerStarted"]


async def test_bad_input_and_no_token(stack, history):
    url, _, _, _ = stack
    async with client(url) as c:
        for params in ({"limit": "0"}, {"since": "soon"}, {"type": "Nope"}):
            r = await c.get("/api/v1/events", params=params)
            assert r.status_code == 422 and isinstance(r.json()["detail"], str)
        assert (await c.get("/api/v1/events/stream", params={"after": "x"})).status_code == 422
        assert (await c.get("/api/v1/calls", params={"status": "boom"})).status_code == 422
        assert (await c.get(f"/api/v1/deployments/app-{ACME}/stats", params={"minutes": "0"})).status_code == 422
    async with httpx.AsyncClient(base_url=url) as anon:
        for path in ("/api/v1/events", "/api/v1/events/stream", "/api/v1/calls", f"/api/v1/deployments/app-{ACME}/stats"):
            assert (await anon.get(path)).status_code == 401


async def test_calls_and_stats(stack, history):
    url, _, _, _ = stack
    async with client(url) as c:
        r = await c.get("/api/v1/calls", params={"status": "error"})
        assert r.headers["X-Total-Count"] == "1"
        call = (await c.get(f"/api/v1/calls/call-{ACME}")).json()
        assert (call["state"], call["attempts"], call["duration_ms"], call["traceback"]) == ("error", 1, 12.5, None)
        assert (await c.post(f"/api/v1/calls/call-{ACME}/cancel")).status_code == 409  # it has finished
        stats = (await c.get(f"/api/v1/deployments/app-{ACME}/stats", params={"minutes": 5})).json()
        assert sum(m["calls"] for m in stats["calls"]) == 1 and len(stats["calls"]) == 5
        assert [s["kind"] for s in stats["cold_starts"]] == ["cold"]
        assert stats["cold_start_summary"]["cold"]["count"] == 1


async def test_endpoint_calls_metered_by_two_replicas_add_up_in_stats(stack, history):
    """Two meters (two replicas, or one before and after a restart) flush the same minute: the table sums
    them, stats merge them with the function call, and the container's first answer is the earliest."""
    url, _, _, gw = stack
    now = dt.datetime.now(dt.timezone.utc)
    other = EndpointMeter()
    for meter, statuses in ((gw.meter, (200, 500, 500)), (other, (200,) * 97)):
        for status in statuses:
            meter.add(ACME, f"app-{ACME}-v1", status, 10.0 if status == 200 else 800.0, now)
    gw.meter.answered(ACME, f"c-{ACME}", now)
    gw.meter.queued(ACME, f"app-{ACME}-v1", 4, now)
    other.queued(ACME, f"app-{ACME}-v1", 6, now)  # the two replicas' peaks: the greater is kept
    other.answered(ACME, f"c-{ACME}", now - dt.timedelta(seconds=3))  # earlier, flushed later
    assert await endpoint_store.flush(gw.pool, gw.meter) and await endpoint_store.flush(gw.pool, other)
    assert await endpoint_store.flush(gw.pool, other)  # nothing left: nothing added twice
    async with client(url) as c:
        stats = (await c.get(f"/api/v1/deployments/app-{ACME}/stats", params={"minutes": 5})).json()
        evil = (await c.get(f"/api/v1/deployments/app-{ACME}/stats", params={"minutes": 5},
                            headers={"Authorization": "Bearer evil-secret"}))
    assert evil.status_code == 404
    assert sum(m["calls"] for m in stats["calls"]) == 1 + 100 and sum(m["errors"] for m in stats["calls"]) == 1 + 2
    busy = max(stats["calls"], key=lambda m: m["calls"])
    assert 8 <= busy["p50_ms"] <= 12 and 600 <= busy["p99_ms"] <= 1000 and busy["queued_peak"] == 6
    assert "endpoint" in stats["notes"]["calls"]
    at = await gw.pool.fetchval("SELECT at FROM gateway.container_first_answers WHERE workspace=$1 AND container_id=$2",
                                ACME, f"c-{ACME}")
    assert abs((at - (now - dt.timedelta(seconds=3))).total_seconds()) < 0.001
