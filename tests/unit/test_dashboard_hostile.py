"""The dashboard against a hostile tenant and a hostile page (written before the code they check).

Another workspace's ids answer 404 everywhere (pass-through, composed views, actions, MCP); a
cross-site change is refused (Origin, missing or wrong CSRF token); a forged, expired or used
sign-in ticket is refused; a forged session cookie is no session; nothing off the allowlist
passes through, and secret values never do. All against the FAKE gateway (tests/fakes).
"""

from __future__ import annotations

import pytest
from fakes.dashboard_harness import dashboard
from fakes.fake_gateway import FakeGateway

pytestmark = pytest.mark.asyncio(loop_scope="function")


def tenant_fixture() -> FakeGateway:
    gw = FakeGateway()
    for ws, cid in (("ws-a", "c-a"), ("ws-b", "c-b")):
        gw.containers[cid] = {"workspace": ws, "container_id": cid, "status": "ready", "correlation_id": f"corr-{ws}"}
        gw.deployments.append({"workspace": ws, "name": f"app-{ws}", "version": 1, "status": "active"})
    gw.secrets["ws-a"] = [{"name": "db", "updated_at": "2026-12-05T00:00:00Z", "value": "s3cret"}]
    return gw


async def test_another_workspaces_container_answers_404_everywhere(tmp_path):
    gw = tenant_fixture()
    await gw.append("ws-b", "ContainerRequested", "container", "c-b", {"container_id": "c-b"}, correlation_id="corr-ws-b")
    async with dashboard(tmp_path, gw) as h:
        a = await h.signed_in("tok-a")
        assert (await a.get("/api/v1/containers/c-a")).status_code == 200
        for path in ("/api/v1/containers/c-b", "/api/v1/containers/c-b/logs", "/api/containers/c-b/waterfall",
                     "/api/chain/corr-ws-b"):
            r = await a.get(path)
            assert r.status_code == 404, (path, r.status_code, r.text)
            assert "s3cret" not in r.text
        r = await a.post("/api/containers/c-b/stop")
        assert r.status_code == 404
        r = await a.post("/api/deployments/app-ws-b/stop")
        assert r.status_code == 404
        assert gw.posts == []  # nothing of ws-b was changed
        listed = (await a.get("/api/v1/containers")).json()
        assert [c["container_id"] for c in listed] == ["c-a"]
        await a.aclose()


async def test_a_cross_site_change_is_refused(tmp_path):
    async with dashboard(tmp_path, tenant_fixture()) as h:
        a = await h.signed_in("tok-a")
        evil = {"Origin": "https://evil.example", "X-CSRF-Token": a.headers["X-CSRF-Token"]}
        r = await a.post("/api/containers/c-a/stop", headers=evil)
        assert r.status_code == 403 and "Origin" in r.json()["detail"]
        r = await a.post("/api/containers/c-a/stop", headers={"Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403
        del a.headers["X-CSRF-Token"]
        r = await a.post("/api/containers/c-a/stop")
        assert r.status_code == 403 and "X-CSRF-Token" in r.json()["detail"]
        r = await a.post("/api/containers/c-a/stop", headers={"X-CSRF-Token": "guessed"})
        assert r.status_code == 403
        r = await a.delete("/api/session")  # signing out is a change too
        assert r.status_code == 403
        assert h.gw.posts == []
        r = await a.post("/api/containers/c-a/stop", headers={"X-CSRF-Token": a.cookies["levers9_csrf"]})
        assert r.status_code == 202, r.text
        assert h.gw.posts == [("ws-a", "/api/v1/containers/c-a/stop")]
        await a.aclose()


async def test_the_paste_box_sign_in_needs_the_csrf_header_too(tmp_path):
    """Login CSRF: a page elsewhere must not sign the browser into the attacker's workspace."""
    async with dashboard(tmp_path, tenant_fixture()) as h, h.client() as c:
        page = await c.get("/signin/")
        assert page.status_code == 200
        r = await c.post("/api/session", json={"token": "tok-b"}, headers={"Origin": "https://evil.example"})
        assert r.status_code == 403
        r = await c.post("/api/session", json={"token": "tok-b"})
        assert r.status_code == 403
        r = await c.post("/api/session", json={"token": "tok-b"}, headers={"X-CSRF-Token": c.cookies["levers9_csrf"]})
        assert r.status_code == 200 and r.json()["workspace"] == "ws-b"


async def test_forged_expired_and_used_tickets_are_refused(tmp_path):
    clock = [1000.0]
    async with dashboard(tmp_path, tenant_fixture()) as h:
        h.app.state.tickets.clock = lambda: clock[0]
        url = await h.ticket("tok-a")
        async with h.client() as c:
            forged = await c.get("/signin?ticket=" + "A" * 43)
            assert forged.status_code == 401 and "levers9_session" not in c.cookies
            assert (await c.get(url)).status_code == 303  # the real one, once
            c.cookies.clear()
            used = await c.get(url)
            assert used.status_code == 401 and "levers9_session" not in c.cookies
        late = await h.ticket("tok-a")
        clock[0] += 121
        async with h.client() as c:
            r = await c.get(late)
            assert r.status_code == 401 and "levers9_session" not in c.cookies
            assert "levers9 dashboard" in r.text


async def test_tickets_need_a_workspace_token(tmp_path):
    async with dashboard(tmp_path, tenant_fixture()) as h, h.client() as c:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Bearer tok-worker"}):
            r = await c.post("/api/session/tickets", headers=headers)
            assert r.status_code == 401, headers


async def test_a_forged_cookie_is_no_session(tmp_path):
    async with dashboard(tmp_path, tenant_fixture()) as h:
        a = await h.signed_in("tok-a")
        sealed = a.cookies["levers9_session"]
        async with h.client() as c:
            for value in ("tok-a", sealed[:-4] + "AAAA", "gAAAAA" + sealed[6:]):
                c.cookies.set("levers9_session", value)
                assert (await c.get("/api/me")).status_code == 401
                r = await c.get("/")
                assert r.status_code == 303 and r.headers["location"] == "/signin/"
        await a.aclose()


async def test_unauthenticated_pages_redirect_and_apis_answer_401(tmp_path):
    async with dashboard(tmp_path, tenant_fixture()) as h, h.client() as c:
        r = await c.get("/")
        assert r.status_code == 303 and r.headers["location"] == "/signin/"
        # a deep link comes back to itself after signing in (the sign-in page takes only a local path)
        for page, back in (("/containers/", "%2Fcontainers%2F"), ("/container/?id=c-a", "%2Fcontainer%2F%3Fid%3Dc-a"),
                           ("/no-such-page", "%2Fno-such-page")):
            r = await c.get(page)
            assert r.status_code == 303 and r.headers["location"] == f"/signin/?next={back}", page
        assert (await c.head("/container/?id=c-a")).status_code == 303  # HEAD as GET, never 405
        for api in ("/api/me", "/api/overview", "/api/v1/containers", "/api/containers/c-a/waterfall",
                    "/api/chain/x", "/events", "/api/nothing"):
            r = await c.get(api)
            assert r.status_code == 401 and r.headers["content-type"].startswith("application/json"), api
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert r.status_code == 401
        r = await c.post("/mcp", json={}, headers={"Authorization": "Bearer tok-worker"})
        assert r.status_code == 401
        assert (await c.get("/signin/")).status_code == 200


async def test_only_the_allowlist_passes_through_and_never_a_secret_value(tmp_path):
    async with dashboard(tmp_path, tenant_fixture()) as h:
        a = await h.signed_in("tok-a")
        for path in ("/api/v1/internal/deployments/d/secrets", "/api/v1/containers/c-a/../../internal/x",
                     "/api/v1/tokens/x/y", "/api/v1/containers/%2e%2e/logs"):
            r = await a.get(path)
            assert r.status_code == 404, (path, r.text)
            assert "never through" not in r.text
        assert (await a.post("/api/v1/tokens")).status_code in (404, 405)
        secrets = await a.get("/api/v1/secrets")
        assert secrets.json() == [{"name": "db", "updated_at": "2026-12-05T00:00:00Z"}]
        await a.aclose()


async def test_a_bearer_token_of_another_workspace_sees_only_its_own(tmp_path):
    async with dashboard(tmp_path, tenant_fixture()) as h, h.client(headers={"Authorization": "Bearer tok-b"}) as b:
        assert (await b.get("/api/v1/containers/c-a")).status_code == 404
        assert (await b.get("/api/containers/c-a/waterfall")).status_code == 404
        assert (await b.get("/api/me")).json()["workspace"] == "ws-b"
