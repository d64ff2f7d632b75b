"""The gateway's side of boxes, on a fake state (no servers but the box's own): an unknown box, another
workspace's box and an endpoint called as a box answer 404 with a sentence; a box called at
/endpoint/ says where it is; a deploy refuses a bad port or an empty command with 422 naming the
field; a call reaches the box's program with its method, path (as sent, still encoded) and query,
never with the caller's token. And the CLI's view of boxes (pure parts)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_gateway_routes import client, gw, spec_json, tar_gz  # noqa: F401

from levers9.cli_boxes import box_rows, newest_container
from levers9.gateway import routes_deployments
from levers9.gateway.body_rules import body_rule
from levers9.gateway.routes_boxes import sub_path

BOX = {"name": "web", "code": {"kind": "box", "module": "", "handler": ""},
       "box": {"command": ["python3", "-m", "http.server", "8000"], "port": 8000}}


def box_row(workspace: str = "default", **spec) -> dict:
    return {"workspace": workspace, "deployment_id": "web-v1", "name": "web", "version": 1, "status": "active",
            "spec": json.dumps(json.loads(spec_json(**{**BOX, **spec})))}


# ---- bad input ---------------------------------------------------------------------------------------

async def test_an_unknown_box_answers_404_with_a_sentence(gw):  # noqa: F811
    async with client(gw) as c:
        for path in ("/box/nope", "/box/nope/", "/box/nope/a/b?x=1"):
            r = await c.get(path)
            assert r.status_code == 404, path
            assert r.json()["detail"].startswith("no box 'nope' in workspace 'default': declare it with app.box(")


async def test_another_workspaces_box_is_not_found(gw):  # noqa: F811
    # the query is the caller's workspace's: the fake pool answers `default`'s box to `other` only if asked
    # with `other`; the route never names another workspace, so the row it gets is the caller's or none
    seen: list[tuple] = []
    real = gw.pool.fetchrow

    async def fetchrow(query, *args):
        seen.append(args)
        return await real(query, *args) if args[0] == "default" else None
    gw.pool.answer("AND status='active' ORDER BY version DESC", [box_row()])
    gw.pool.fetchrow = fetchrow
    async with client(gw, "l9_other") as c:
        r = await c.post("/box/web/x", content="hi")
    assert r.status_code == 404 and "no box 'web' in workspace 'other'" in r.json()["detail"]
    assert seen and all(args[0] == "other" for args in seen)


async def test_an_endpoint_is_no_box_and_a_box_is_no_endpoint(gw):  # noqa: F811
    endpoint = {**box_row(), "spec": spec_json(name="web", code={"module": "app", "handler": "h"}, box=None)}
    gw.pool.answer("AND status='active' ORDER BY version DESC", [endpoint])
    async with client(gw) as c:
        r = await c.get("/box/web/")
        assert r.status_code == 404 and "'web' is an endpoint, not a box: call it at /endpoint/web" in r.json()["detail"]
        gw.deployments.clear()
        gw.pool.answer("AND status='active' ORDER BY version DESC", [box_row()])
        r = await c.post("/endpoint/web", json={})
        assert r.status_code == 404 and "'web' is a box, not an endpoint: call it at /box/web/" in r.json()["detail"]


@pytest.mark.parametrize("box, field", [({"command": ["srv"], "port": 0}, "$.box.port"),
                                        ({"command": ["srv"], "port": 65536}, "$.box.port"),
                                        ({"command": [], "port": 80}, "$.box.command"),
                                        ({"command": ["srv"], "port": 80, "ready_path": "x"}, "$.box.ready_path")])
async def test_a_deploy_refuses_a_bad_port_or_command_naming_the_field(gw, monkeypatch, box, field):  # noqa: F811
    async def put_code(gw, workspace, data):
        return "ab" * 32, "code/ab.tar.gz"

    monkeypatch.setattr(routes_deployments, "put_code", put_code)
    code = {"code": ("code.tar.gz", tar_gz({"box_app.py": b"# a box\n"}), "application/gzip")}
    async with client(gw) as c:
        r = await c.post("/api/v1/deployments", data={"spec": json.dumps({**BOX, "box": box})}, files=code)
        assert r.status_code == 422 and field in r.json()["detail"], r.text
        assert gw.bus.events() == []
        ok = await c.post("/api/v1/deployments", data={"spec": json.dumps(BOX)}, files=code)  # no module to find
        assert ok.status_code == 201 and ok.json()["url"] == "http://gw/box/web/", ok.text


# ---- the path the program sees -------------------------------------------------------------------------

@given(st.text(alphabet=st.sampled_from("abc/%20-_.~?"), max_size=30))
def test_the_sub_path_is_the_raw_path_below_the_box(rest):
    assert sub_path(f"/box/web/{rest}", "web", "ignored") == rest
    assert sub_path("/box/web", "web", "") == ""


def test_a_name_written_percent_encoded_falls_back_to_the_decoded_path_quoted_again():
    assert sub_path("/box/w%65b/a%20b", "web", "a b") == "a%20b"


def test_box_calls_are_proxied_as_they_come():
    limits = {"code_limit": 1, "file_limit": 1, "call_limit": 1}
    assert body_rule("POST", "/box/web/upload", **limits) is None  # routes_invoke's own limit holds


async def test_a_call_reaches_the_program_with_its_method_path_and_query_and_without_the_token(gw):  # noqa: F811
    from aiohttp import ClientSession, web

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"method": request.method, "path": request.raw_path,
                                  "auth": request.headers.get("Authorization", ""),
                                  "body": (await request.read()).decode()}, headers={"X-From": "box"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    gw.pool.answer("AND status='active' ORDER BY version DESC", [box_row(timeout_seconds=5)])
    gw.pool.answer("AND deployment_id=$2 AND status NOT IN", [
        {"container_id": "c1", "status": "ready", "address": f"http://127.0.0.1:{runner.addresses[0][1]}"}])
    gw.session = ClientSession()
    try:
        async with client(gw) as c:
            r = await c.put("/box/web/a%2Fb/c?x=1&y=%20", content="data")
            assert r.status_code == 200 and r.headers["x-from"] == "box", r.text
            assert r.json() == {"method": "PUT", "path": "/a%2Fb/c?x=1&y=%20", "auth": "", "body": "data"}
            root = await c.delete("/box/web")
            assert root.json()["path"] == "/" and root.headers["x-levers9-container-id"] == "c1"
            assert (await c.get("/box/web/v2/x")).json()["path"] == "/v2/x"  # no version is read from a box's path
    finally:
        await gw.session.close()
        await runner.cleanup()


# ---- the CLI's view ---------------------------------------------------------------------------------------

def test_boxes_list_shows_only_boxes_with_their_command_port_and_url():
    deployments = [{"name": "web", "version": 2, "status": "active", "deployment_id": "web-v2", "containers": 1,
                    "spec": {**BOX, "checkpoint_enabled": True}},
                   {"name": "hello", "version": 1, "status": "active", "spec": {"code": {"kind": "endpoint"}}}]
    [row] = box_rows(deployments, "http://gw")
    assert row["command"] == "python3 -m http.server 8000" and row["port"] == 8000
    assert row["url"] == "http://gw/box/web/" and row["checkpoint_enabled"] and row["containers"] == 1


def test_boxes_logs_reads_the_newest_container_of_the_box_a_failed_one_included():
    containers = [{"container_id": "a", "deployment_id": "web-v1", "created_at": "2026-01-01T00:00:01"},
                  {"container_id": "b", "deployment_id": "web-v2", "created_at": "2026-01-01T00:00:03",
                   "status": "failed"},
                  {"container_id": "c", "deployment_id": "other-v1", "created_at": "2026-01-01T00:00:09"}]
    assert newest_container(containers, {"web-v1", "web-v2"})["container_id"] == "b"
    assert newest_container(containers, {"nope"}) is None


def test_the_gateway_documents_box_calls():
    from fastapi import FastAPI

    from levers9.gateway import routes_boxes
    from levers9.gateway.openapi_docs import document
    app = FastAPI()
    app.include_router(routes_boxes.router)
    document(app)
    paths = app.openapi()["paths"]
    assert "404" in paths["/box/{name}/{rest}"]["get"]["responses"]
    assert "default" in paths["/box/{name}"]["post"]["responses"]
