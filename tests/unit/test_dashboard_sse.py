"""`/events`: one upstream stream per workspace fanned out to its clients, never another
workspace's event, a slow client dropped without holding the others, and Last-Event-ID resuming
with nothing missed and nothing twice (also across a restart of the dashboard). Against the FAKE
gateway (tests/fakes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator

import httpx
import pytest
from fakes.dashboard_harness import dashboard
from fakes.fake_gateway import FakeGateway, serving
from prometheus_client import REGISTRY

from levers9.dashboard.fanout import Hub
from levers9.dashboard.upstream import Upstream, sse_messages

pytestmark = pytest.mark.asyncio(loop_scope="function")


@contextlib.asynccontextmanager
async def listening(c: httpx.AsyncClient, last_id: str | None = None) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
    """A stream of /events, open (the dashboard has subscribed it) when the block starts."""
    headers = {"Last-Event-ID": last_id} if last_id else {}
    async with c.stream("GET", "/events", headers=headers, timeout=httpx.Timeout(10, read=10)) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")

        async def events() -> AsyncIterator[dict[str, Any]]:
            async for msg_id, event_type, data in sse_messages(r.aiter_lines()):
                doc = json.loads(data)
                assert str(doc["seq"]) == msg_id and doc["type"] == event_type
                yield doc

        yield events()


async def take(events: AsyncIterator[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    out = []
    async with asyncio.timeout(10):
        async for ev in events:
            out.append(ev)
            if len(out) == n:
                return out
    return out


async def test_one_upstream_per_workspace_fans_out_and_isolates(tmp_path):
    async with dashboard(tmp_path) as h:
        a1, a2, b = await h.signed_in("tok-a"), await h.signed_in("tok-a"), await h.signed_in("tok-b")
        async with listening(a1) as s1, listening(a2) as s2, listening(b) as sb:
            await h.gw.append("ws-a", "ContainerRequested", "container", "c1")
            await h.gw.append("ws-b", "ContainerRequested", "container", "c2")
            await h.gw.append("_sys", "WorkerReady", "worker", "w1")
            await h.gw.append("ws-a", "ContainerReady", "container", "c1")
            got1, got2, gotb = await asyncio.gather(take(s1, 3), take(s2, 3), take(sb, 2))
        assert [e["seq"] for e in got1] == [e["seq"] for e in got2] == [1, 3, 4]
        assert [(e["workspace"], e["type"]) for e in gotb] == [("ws-b", "ContainerRequested"), ("_sys", "WorkerReady")]
        assert [ws for ws, _ in h.gw.stream_opens].count("ws-a") == 1  # two browsers, one upstream
        for c in (a1, a2, b):
            await c.aclose()


async def test_bearer_token_works_on_events(tmp_path):
    async with dashboard(tmp_path) as h, h.client(headers={"Authorization": "Bearer tok-a"}) as c:
        async with listening(c) as s:
            await h.gw.append("ws-a", "DeploymentCreated", "deployment", "d1")
            assert [e["type"] for e in await take(s, 1)] == ["DeploymentCreated"]


async def test_last_event_id_resumes_with_nothing_missed_or_twice(tmp_path):
    async with dashboard(tmp_path) as h:
        a = await h.signed_in("tok-a")
        async with listening(a) as s:
            for i in range(5):
                await h.gw.append("ws-a", "ContainerStarted", "container", f"c{i}")
            first = await take(s, 5)
        for i in range(5, 9):  # while the browser is away (the hub keeps them in its ring)
            await h.gw.append("ws-a", "ContainerStarted", "container", f"c{i}")
        async with listening(a, str(first[-1]["seq"])) as s:
            await h.gw.append("ws-a", "ContainerReady", "container", "c9")
            rest = await take(s, 5)
        assert [e["seq"] for e in first + rest] == list(range(1, 11))
        await a.aclose()


async def test_resuming_from_before_the_ring_gets_a_stream_of_its_own(tmp_path):
    async with dashboard(tmp_path, ring=3) as h:
        a = await h.signed_in("tok-a")
        async with listening(a) as s:
            for i in range(8):
                await h.gw.append("ws-a", "ContainerStarted", "container", f"c{i}")
            assert len(await take(s, 8)) == 8
            async with listening(await h.signed_in("tok-a"), "2") as old:
                assert [e["seq"] for e in await take(old, 6)] == [3, 4, 5, 6, 7, 8]
        assert ("ws-a", 2) in h.gw.stream_opens
        await a.aclose()


async def test_a_restarted_dashboard_keeps_sessions_and_resumes(tmp_path):
    gw = FakeGateway()
    async with dashboard(tmp_path, gw) as h:
        a = await h.signed_in("tok-a")
        async with listening(a) as s:
            await gw.append("ws-a", "ContainerStarted", "container", "c0")
            seen = await take(s, 1)
        cookies, csrf = dict(a.cookies), a.headers["X-CSRF-Token"]
        await a.aclose()
    await gw.append("ws-a", "ContainerReady", "container", "c0")  # while the dashboard is down
    async with dashboard(tmp_path, gw) as h2, h2.client(cookies=cookies) as again:
        assert (await again.get("/api/me")).json()["workspace"] == "ws-a"
        async with listening(again, str(seen[-1]["seq"])) as s:
            await gw.append("ws-a", "ContainerStopped", "container", "c0")
            assert [e["type"] for e in await take(s, 2)] == ["ContainerReady", "ContainerStopped"]
        r = await again.post("/api/containers/c0/stop", headers={"X-CSRF-Token": csrf, "Origin": h2.url})
        assert r.status_code == 404  # the session works for changes too (the fake has no container c0)


async def test_a_slow_client_is_dropped_and_the_others_get_everything(tmp_path):
    """At the hub: publishing never waits for a client; the one that stops reading is dropped once
    its queue is full, the reading one gets every event."""
    gw = FakeGateway()
    async with serving(gw.app) as url:
        upstream = Upstream(url)
        hub = Hub("ws-a", upstream, client_queue=5, linger_s=0.1)
        fast = await hub.subscribe("tok-a", None)
        slow = await hub.subscribe("tok-a", None)
        got = []
        for seq in range(hub.last_seq + 1, hub.last_seq + 21):
            hub.publish(seq, "ContainerStarted", json.dumps({"seq": seq}))  # synchronous: nothing to wait for
            while not fast.queue.empty():
                got.append(fast.queue.get_nowait())
        assert len(got) == 20 and not fast.dropped
        assert slow.dropped and slow not in hub.clients
        assert slow.queue.get_nowait() is None  # its stream ends at once, what it had is thrown away
        hub.unsubscribe(fast)
        if hub.task:
            hub.task.cancel()
        await upstream.close()


async def test_a_dropped_browser_reconnects_and_resumes_from_the_ring(tmp_path):
    async with dashboard(tmp_path) as h:
        a = await h.signed_in("tok-a")
        hub = h.app.state.hubs.hub("ws-a")
        dropped_before = REGISTRY.get_sample_value("levers9_dashboard_sse_dropped_total") or 0
        async with listening(a) as s:
            await h.gw.append("ws-a", "ContainerStarted", "container", "c0")
            first = await take(s, 1)
            for client in list(hub.clients):
                hub.drop(client)
            assert await take(s, 1) == []  # its stream ended
        await h.gw.append("ws-a", "ContainerReady", "container", "c0")
        async with listening(a, str(first[0]["seq"])) as s:
            assert [e["type"] for e in await take(s, 1)] == ["ContainerReady"]
        metrics = (await a.get("/metrics")).text
        assert f"levers9_dashboard_sse_dropped_total {dropped_before + 1}" in metrics
        await a.aclose()
