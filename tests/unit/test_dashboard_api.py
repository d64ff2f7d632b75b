"""The dashboard's browser API against the FAKE gateway (tests/fakes): sign-in by ticket and by
pasted token, sign-out, /api/me, the composed views, actions, the pass-through's headers, the web
app's pages (a stand-in export, not the real one) and 404 page, /healthz and /metrics, the key file."""

from __future__ import annotations

import stat

import pytest
from fakes.dashboard_harness import dashboard
from fakes.fake_gateway import FakeGateway

pytestmark = pytest.mark.asyncio(loop_scope="function")


def platform() -> FakeGateway:
    gw = FakeGateway()
    gw.deployments += [{"workspace": "ws-a", "name": "hello", "version": v, "status": s, "deployment_id": f"d{v}"}
                       for v, s in ((1, "stopped"), (2, "active"))]
    for i, status in enumerate(["ready", "ready", "requested", "stopped", "failed"]):
        gw.containers[f"c{i}"] = {"workspace": "ws-a", "container_id": f"c{i}", "status": status,
                                  "correlation_id": "corr-1"}
    gw.workers.append({"worker_id": "local-1", "pool": "default", "status": "ready", "cpu_millicores": 2000,
                       "cpu_used": 500, "memory_mib": 4096, "memory_used": 1024, "gpu_type": "", "gpu_count": 0})
    gw.logs["c0"] = "line 1\nline 2\n"
    return gw


async def test_sign_in_by_ticket_sets_strict_http_only_cookies_then_signs_out(tmp_path):
    async with dashboard(tmp_path, platform()) as h:
        url = await h.ticket("tok-a")
        assert url.startswith(f"{h.url}/signin?ticket=")
        async with h.client() as c:
            r = await c.get(url)
            assert r.status_code == 303 and r.headers["location"] == "/"
            cookies = r.headers.get_list("set-cookie")
            session = next(x for x in cookies if x.startswith("levers9_session="))
            csrf = next(x for x in cookies if x.startswith("levers9_csrf="))
            assert "HttpOnly" in session and "SameSite=strict" in session and "Path=/" in session
            assert "HttpOnly" not in csrf and "SameSite=strict" in csrf
            assert "tok-a" not in session  # sealed, not the token itself
            assert (await c.get("/api/me")).json() == {"workspace": "ws-a", "gateway_url": h.gateway_url, "via": "cookie"}
            r = await c.delete("/api/session", headers={"X-CSRF-Token": c.cookies["levers9_csrf"]})
            assert r.status_code == 200
            assert (await c.get("/api/me")).status_code == 401
    key = tmp_path / "dashboard" / "session.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


async def test_sign_in_by_pasted_token(tmp_path):
    async with dashboard(tmp_path, platform()) as h, h.client() as c:
        await c.get("/signin/")
        headers = {"X-CSRF-Token": c.cookies["levers9_csrf"], "Origin": h.url}
        assert (await c.post("/api/session", json={"token": "wrong"}, headers=headers)).status_code == 401
        r = await c.post("/api/session", data={"token": "tok-a"}, headers=headers)  # a form works too
        assert r.status_code == 200 and r.json() == {"workspace": "ws-a"}
        assert (await c.get("/api/me")).json()["workspace"] == "ws-a"


async def test_overview_composes_deployments_containers_workers_and_failures(tmp_path):
    gw = platform()
    await gw.append("ws-a", "ContainerFailed", "container", "c4", {"container_id": "c4", "reason": "exit 137: OOM"})
    await gw.append("ws-b", "ContainerFailed", "container", "x", {"reason": "not yours"})
    async with dashboard(tmp_path, gw) as h:
        a = await h.signed_in("tok-a")
        o = (await a.get("/api/overview")).json()
        assert [(d["name"], d["version"], len(d["versions"])) for d in o["deployments"]] == [("hello", 2, 2)]
        assert o["containers"] == {"by_state": {"ready": 2, "requested": 1}, "live": 3, "total": 5, "ended": 2}
        assert o["pools"][0]["free"] == {"cpu_millicores": 1500, "memory_mib": 3072, "gpus": 0}
        assert [f["reason"] for f in o["failures"]] == ["exit 137: OOM"]
        await a.aclose()


async def test_pass_through_keeps_paging_headers_and_streams_logs(tmp_path):
    async with dashboard(tmp_path, platform()) as h:
        a = await h.signed_in("tok-a")
        r = await a.get("/api/v1/containers?all=true&limit=2&offset=1")
        assert r.status_code == 200 and r.headers["x-total-count"] == "5"
        assert [c["container_id"] for c in r.json()] == ["c1", "c2"]
        for i in range(3):
            await h.gw.append("ws-a", "ContainerStarted", "container", f"c{i}")
        r = await a.get("/api/v1/events?limit=2")
        assert [e["seq"] for e in r.json()] == [3, 2] and r.headers["x-next-before"] == "2"
        assert (await a.get("/api/v1/containers/c0/logs")).text == "line 1\nline 2\n"
        await a.aclose()


async def test_waterfall_and_chain(tmp_path):
    gw = platform()
    req = await gw.append("ws-a", "ContainerRequested", "container", "c0", {"container_id": "c0"}, correlation_id="corr-1")
    sch = await gw.append("ws-a", "ContainerScheduled", "container", "c0", {"container_id": "c0", "worker_id": "w"},
                          correlation_id="corr-1", causation_id=req["id"])
    await gw.append("ws-a", "ContainerStarted", "container", "c0", {"container_id": "c0", "restored_from": "ck"},
                    correlation_id="corr-1", causation_id=sch["id"])
    await gw.append("ws-a", "ContainerReady", "container", "c0", {"container_id": "c0"}, correlation_id="corr-1",
                    causation_id=sch["id"])
    async with dashboard(tmp_path, gw) as h:
        a = await h.signed_in("tok-a")
        w = (await a.get("/api/containers/c0/waterfall")).json()
        assert [p["name"] for p in w["phases"]] == ["requested", "placed", "restored", "ready"] and w["kind"] == "restored"
        chain = (await a.get("/api/chain/corr-1")).json()
        assert [r["event"]["type"] for r in chain["roots"]] == ["ContainerRequested"]
        placed = chain["roots"][0]["children"][0]
        assert [c["event"]["type"] for c in placed["children"]] == ["ContainerStarted", "ContainerReady"]
        assert (await a.get("/api/chain/no-such")).status_code == 404
        assert (await a.get("/api/containers/nope/waterfall")).status_code == 404
        await a.aclose()


async def test_actions_reach_the_gateway_with_the_users_token(tmp_path):
    async with dashboard(tmp_path, platform()) as h:
        a = await h.signed_in("tok-a")
        assert (await a.post("/api/deployments/hello/stop")).status_code == 200
        assert (await a.post("/api/calls/k1/cancel")).status_code == 202
        r = await a.post("/api/workers/local-1/drain")
        assert r.status_code == 403 and "admin" in r.json()["detail"]  # the gateway's refusal, as it said it
        assert (await a.post("/api/workers/local-1/explode")).status_code == 404
        admin = await h.signed_in("tok-admin")
        assert (await admin.post("/api/workers/local-1/cordon")).status_code == 202
        assert h.gw.posts == [("ws-a", "/api/v1/deployments/hello/stop"), ("ws-a", "/api/v1/calls/k1/cancel"),
                              ("admin", "/api/v1/workers/local-1/cordon")]
        await a.aclose()
        await admin.aclose()


async def test_pages_of_the_export_and_its_404(tmp_path):
    out = tmp_path / "out"
    (out / "containers").mkdir(parents=True)
    (out / "_next" / "static").mkdir(parents=True)
    (out / "index.html").write_text("<p>overview page</p>")
    (out / "containers" / "index.html").write_text("<p>containers page</p>")
    (out / "signin").mkdir()
    (out / "signin" / "index.html").write_text("<p>sign-in page</p>")
    (out / "404.html").write_text("<p>no such page</p>")
    (out / "_next" / "static" / "app.js").write_text("console.log(1)")
    (tmp_path / "secret.txt").write_text("outside the export")
    async with dashboard(tmp_path, platform(), web_out=out) as h:
        async with h.client() as anon:
            assert (await anon.get("/_next/static/app.js")).text == "console.log(1)"  # assets are public
            assert (await anon.get("/signin/")).text == "<p>sign-in page</p>"
            assert (await anon.get("/containers/")).status_code == 303
        a = await h.signed_in("tok-a")
        assert (await a.get("/")).text == "<p>overview page</p>"
        assert (await a.get("/containers/?id=c0")).text == "<p>containers page</p>"
        assert (await a.get("/containers")).text == "<p>containers page</p>"
        r = await a.get("/no/such/page")
        assert r.status_code == 404 and r.text == "<p>no such page</p>"
        for sneaky in ("/../secret.txt", "/%2e%2e/secret.txt", "/..%2fsecret.txt"):
            r = await a.get(sneaky)
            assert "outside the export" not in r.text, sneaky
        await a.aclose()


async def test_without_an_export_placeholders_stand_in(tmp_path):
    async with dashboard(tmp_path, platform()) as h:
        a = await h.signed_in("tok-a")
        assert (await a.get("/")).status_code == 200
        assert (await a.get("/nowhere")).status_code == 404
        async with h.client() as anon:
            assert "Sign in" in (await anon.get("/signin/")).text
            assert (await anon.get("/signin")).status_code == 307
        await a.aclose()


async def test_healthz_and_metrics(tmp_path):
    async with dashboard(tmp_path, platform()) as h, h.client() as c:
        health = (await c.get("/healthz")).json()
        assert health["service"] == "dashboard" and health["healthy"] and health["checks"] == {"gateway": "ok"}
        metrics = (await c.get("/metrics")).text
        assert "levers9_dashboard_requests_total" in metrics and "levers9_dashboard_sse_clients" in metrics
