"""The dashboard's notebook proxy (routes_notebooks.py): `/nb/NAME/...` to the gateway's
`/box/NAME/nb/NAME/...`, against the FAKE gateway with a box route and a box WebSocket added (the
notebook `nb1` is ws-a's; any other is the gateway's 404). Hostile first: a bad name or a dot
segment is 404 before anything reaches the gateway; a session's change from another site's page (or
with neither Origin nor Sec-Fetch-Site) is 403; no session is 401 or the sign-in page. Then: the
path and query as written, the session's token as Bearer, its cookies stripped while Jupyter's pass,
`Set-Cookie` back, a large answer streamed (its first part arrives before the rest is made) and a
large body sent whole, a kernel's WebSocket with its subprotocol."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import aiohttp
import yarl
from fakes.dashboard_harness import Harness, dashboard
from fakes.fake_gateway import TOKENS, FakeGateway
from fastapi import FastAPI, HTTPException, Request, Response, WebSocket
from fastapi.responses import JSONResponse, StreamingResponse
from test_websockets_dashboard import refused  # the WebSocket handshake refusal, as those tests read it

from levers9.dashboard.routes_websockets import gateway_ws_url

CHUNK = bytes(range(256)) * 4096  # 1 MiB
BIG_CHUNKS = 8
KERNEL = "v1.kernel.websocket.jupyter.org"


class NotebookGateway(FakeGateway):
    """The fake gateway, with boxes: every box request is recorded before it is decided."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.first_part_read = asyncio.Event()  # the test read the big answer's first MiB
        super().__init__()

    def _app(self) -> FastAPI:
        app = super()._app()
        app.add_api_route("/box/{name}/{rest:path}", self.box, methods=["GET", "HEAD", "OPTIONS", "POST", "PUT",
                                                                          "PATCH", "DELETE"])
        app.add_api_websocket_route("/box/{name}/{rest:path}", self.box_socket)
        return app

    @staticmethod
    def target(scope: dict[str, Any]) -> str:
        query = scope["query_string"].decode()
        return scope["raw_path"].decode() + (f"?{query}" if query else "")

    async def box(self, name: str, rest: str, request: Request) -> Response:
        body = await request.body()
        self.seen.append({"method": request.method, "path": self.target(request.scope),
                          "auth": request.headers.get("authorization", ""), "cookie": request.headers.get("cookie", ""),
                          "headers": dict(request.headers), "body": (len(body), hashlib.sha256(body).hexdigest())})
        workspace = self.caller(request)
        if (workspace, name) != ("ws-a", "nb1"):
            raise HTTPException(404, f"no box {name!r} in workspace {workspace!r}")
        if rest == "nb/nb1/big":
            return StreamingResponse(self.big(), media_type="application/javascript")
        response = JSONResponse({"path": self.target(request.scope)}, headers={"Connection": "x-hop",
                                                                               "X-Hop": "never on"})
        response.set_cookie("_xsrf", "x1", path="/nb/nb1/")
        response.set_cookie("username-nb1", "u1", path="/nb/nb1/", httponly=True)
        return response

    async def big(self) -> Any:
        yield CHUNK
        await self.first_part_read.wait()  # streamed: the dashboard passed the first MiB on already
        for _ in range(BIG_CHUNKS - 1):
            yield CHUNK

    async def box_socket(self, websocket: WebSocket, name: str, rest: str) -> None:
        offered = list(websocket.scope.get("subprotocols") or [])
        self.seen.append({"path": self.target(websocket.scope), "auth": websocket.headers.get("authorization", ""),
                          "cookie": websocket.headers.get("cookie", ""), "protocols": offered})
        await websocket.accept(subprotocol=offered[0] if offered else None)
        async for text in websocket.iter_text():
            await websocket.send_text(text)


def cookie(h: Harness, token: str = "tok-a", extra: str = "") -> str:
    sealed, session = h.app.state.sealer.seal(token, TOKENS[token][0])
    return f"levers9_session={sealed}; levers9_csrf={session.csrf}" + (f"; {extra}" if extra else "")


# ---- hostile ------------------------------------------------------------------------------------------------

async def test_a_bad_name_or_a_dot_segment_is_404_and_reaches_nothing(tmp_path):
    async with dashboard(tmp_path, NotebookGateway()) as h, h.client() as c:
        own = {"Cookie": cookie(h), "Origin": h.url}
        for path in ("/nb/Big/", "/nb/-x/", "/nb/a_b/tree", "/nb/" + "a" * 64 + "/", "/nb/nb1%2Fx/", "/nb/Big"):
            r = await c.get(path, headers=own)
            assert r.status_code == 404 and "notebook" in r.json()["detail"], path
        async with aiohttp.ClientSession() as s:  # as written: no client resolves the dots first
            for path in ("/nb/nb1/../../../../api/v1/whoami", "/nb/nb1/./tree", "/nb/nb1/x/.."):
                async with s.get(yarl.URL(h.url + path, encoded=True), headers=own) as r:
                    assert r.status == 404 and "dot" in (await r.json())["detail"], path
        assert await refused(h.url + "/nb/BAD/api/kernels/k/channels", own) == 404
        assert h.gw.seen == []


async def test_a_sessions_change_from_another_sites_page_is_refused(tmp_path):
    async with dashboard(tmp_path, NotebookGateway()) as h, h.client() as c:
        session = {"Cookie": cookie(h, extra="_xsrf=x1"), "X-XSRFToken": "x1"}
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                            {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                            {}):  # neither Origin nor Sec-Fetch-Site: not told it is our page, so refused
                r = await c.request(method, "/nb/nb1/api/contents/a.ipynb", headers={**session, **headers},
                                    content=b"{}")
                assert r.status_code == 403 and "own pages" in r.json()["detail"], (method, headers)
        assert await refused(h.url + "/nb/nb1/api/kernels/k/channels",
                                {"Cookie": session["Cookie"], "Origin": "https://evil.example"}) == 403
        assert h.gw.seen == []


async def test_not_signed_in_is_sent_to_sign_in_or_told_401(tmp_path):
    async with dashboard(tmp_path, NotebookGateway()) as h, h.client() as c:
        r = await c.get("/nb/nb1/tree", headers={"Accept": "text/html,application/xhtml+xml"})
        assert r.status_code == 303 and r.headers["location"] == "/signin/?next=%2Fnb%2Fnb1%2Ftree"
        for headers in ({"Accept": "application/json"}, {"Cookie": "levers9_session=forged"},
                        {"Authorization": "Bearer tok-nope"}):
            r = await c.get("/nb/nb1/api/kernels", headers=headers)
            assert r.status_code == 401 and "not signed in" in r.json()["detail"]
        r = await c.post("/nb/nb1/api/kernels", headers={"Origin": h.url})
        assert r.status_code == 401
        assert await refused(h.url + "/nb/nb1/api/kernels/k/channels", {"Origin": h.url}) == 401
        assert h.gw.seen == []


async def test_another_workspaces_notebook_is_the_gateways_404(tmp_path):
    async with dashboard(tmp_path, NotebookGateway()) as h, h.client() as c:
        r = await c.get("/nb/nb1/tree", headers={"Cookie": cookie(h, "tok-b")})
        assert r.status_code == 404 and r.json() == {"detail": "no box 'nb1' in workspace 'ws-b'"}


# ---- through ------------------------------------------------------------------------------------------------

async def test_the_name_alone_is_sent_to_its_folder(tmp_path):
    async with dashboard(tmp_path, NotebookGateway()) as h, h.client() as c:
        for method in ("GET", "POST"):
            r = await c.request(method, "/nb/nb1?token=&x=%2F")
            assert r.status_code == 307 and r.headers["location"] == "/nb/nb1/?token=&x=%2F"


async def test_the_path_and_query_go_as_written_with_the_sessions_token(tmp_path):
    async with dashboard(tmp_path, NotebookGateway()) as h, h.client() as c:
        headers = {"Cookie": cookie(h, extra="_xsrf=x1; theme=dark"), "Authorization": "token jupyters-own",
                   "Connection": "x-hop", "X-Hop": "never on", "X-Kept": "yes"}
        r = await c.get("/nb/nb1/api/contents/dir%2Fa%20b.ipynb?content=1&q=%2F%20", headers=headers)
        assert r.status_code == 200
        assert r.json() == {"path": "/box/nb1/nb/nb1/api/contents/dir%2Fa%20b.ipynb?content=1&q=%2F%20"}
        assert sorted(c.split(";")[0] for c in r.headers.get_list("set-cookie")) == ["_xsrf=x1", "username-nb1=u1"]
        assert "x-hop" not in r.headers
        seen = h.gw.seen[-1]
        assert seen["auth"] == "Bearer tok-a" and seen["cookie"] == "_xsrf=x1; theme=dark"
        assert seen["headers"]["x-kept"] == "yes" and "x-hop" not in seen["headers"]
        assert (await c.head("/nb/nb1/", headers=headers)).status_code == 200
        assert h.gw.seen[-1]["method"] == "HEAD" and h.gw.seen[-1]["path"] == "/box/nb1/nb/nb1/"


async def test_a_change_from_its_own_pages_or_a_bearer_goes_through(tmp_path):
    async with dashboard(tmp_path, NotebookGateway()) as h, h.client() as c:
        session = {"Cookie": cookie(h, extra="_xsrf=x1"), "X-XSRFToken": "x1"}
        body = CHUNK * 4  # sent whole, as it comes
        for headers in ({"Origin": h.url}, {"Sec-Fetch-Site": "same-origin"}, {"Authorization": "Bearer tok-a"}):
            c.cookies.clear()  # only the cookies written here: not those the answers set
            r = await c.put("/nb/nb1/api/contents/a.ipynb", content=body,
                            headers={**(session if "Authorization" not in headers else {}), **headers})
            assert r.status_code == 200, (headers, r.text)
            seen = h.gw.seen[-1]
            assert seen["method"] == "PUT" and seen["auth"] == "Bearer tok-a"
            assert seen["body"] == (len(body), hashlib.sha256(body).hexdigest())
        assert [s["cookie"] for s in h.gw.seen] == ["_xsrf=x1", "_xsrf=x1", ""]


async def test_a_large_answer_is_streamed_and_arrives_whole(tmp_path):
    gw = NotebookGateway()
    async with dashboard(tmp_path, gw) as h, h.client() as c:
        whole = hashlib.sha256()
        got = 0
        async with asyncio.timeout(60):  # a bound, not a wait: a buffering proxy would hang here
            async with c.stream("GET", "/nb/nb1/big", headers={"Cookie": cookie(h)}) as r:
                assert r.status_code == 200 and r.headers["content-type"] == "application/javascript"
                async for part in r.aiter_raw():
                    whole.update(part)
                    got += len(part)
                    if got >= len(CHUNK):
                        gw.first_part_read.set()
        assert got == len(CHUNK) * BIG_CHUNKS
        assert whole.hexdigest() == hashlib.sha256(CHUNK * BIG_CHUNKS).hexdigest()


async def test_a_kernels_websocket_goes_through_with_its_subprotocol(tmp_path):
    async with dashboard(tmp_path, NotebookGateway()) as h, aiohttp.ClientSession() as s:
        headers = {"Cookie": cookie(h, extra="_xsrf=x1"), "Origin": h.url}
        url = h.url + "/nb/nb1/api/kernels/k%201/channels?session_id=s1"
        async with s.ws_connect(url, headers=headers, protocols=[KERNEL]) as ws:
            assert ws.protocol == KERNEL
            await ws.send_str('{"msg_type": "kernel_info_request"}')
            assert await ws.receive_str() == '{"msg_type": "kernel_info_request"}'
        async with s.ws_connect(h.url + "/nb/nb1/api/kernels/k2/channels", headers=headers) as ws:
            assert ws.protocol is None
            await ws.send_str("plain")
            assert await ws.receive_str() == "plain"
        assert h.gw.seen == [
            {"path": "/box/nb1/nb/nb1/api/kernels/k%201/channels?session_id=s1", "auth": "Bearer tok-a",
             "cookie": "_xsrf=x1", "protocols": [KERNEL]},
            {"path": "/box/nb1/nb/nb1/api/kernels/k2/channels", "auth": "Bearer tok-a", "cookie": "_xsrf=x1",
             "protocols": []}]


def test_a_relayed_websockets_url_is_sent_as_written():
    """No dot segment resolved, no escape decoded (yarl would make `/box/x/%2e%2e/` into `/box/`)."""
    url = gateway_ws_url("http://gw:1/", "/box/nb1/nb/nb1/%2e%2e/a%2Fb c", "q=%20&x")
    assert str(url) == "http://gw:1/box/nb1/nb/nb1/%2e%2e/a%2Fb%20c?q=%20&x"
