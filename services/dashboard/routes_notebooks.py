"""Notebooks through the dashboard: `/nb/NAME/...` is the box NAME (a Jupyter Server started with
`--ServerApp.base_url=/nb/NAME/`), reached at the gateway's `/box/NAME/nb/NAME/...`.

  {dashboard}/nb/NAME              -> 307 to /nb/NAME/ (query kept)
  {dashboard}/nb/NAME/REST?QUERY   -> {gateway}/box/NAME/nb/NAME/REST?QUERY, any method, and
                                      WebSocket upgrades (a kernel's channels) the same way

REST and QUERY go as the caller wrote them (percent-encoding kept). The gateway gives the box the
path below /box/NAME/, so Jupyter sees `/nb/NAME/REST`: the very path the browser asked, and every
link, redirect and cookie path Jupyter makes under its base_url is right as it is.

Why the dashboard's own origin serves them: the browser's credential is the dashboard's session
cookie, which it sends only to the dashboard; a notebook on another origin would need a sign-in of
its own. The session's token goes to the gateway as `Authorization: Bearer`, and the gateway decides
as for any caller (another workspace's notebook: its 404, passed on as it is). The cost: a
notebook's pages run on the dashboard's origin, so script in a notebook (the workspace's own code)
can call the dashboard's API as the signed-in user.

Refused before anything reaches the gateway: a NAME no deployment can have, or one written
percent-encoded, and a `.` or `..` segment in REST (404: an HTTP client resolves those, and the
path would leave /box/NAME/); no session or an unknown bearer (401, or the sign-in page for a
browser's GET of a page); a session's change (not GET, HEAD, OPTIONS) whose Origin is not this
dashboard's, or, without Origin, whose Sec-Fetch-Site is not same-origin, or that has neither (403:
a page of any site could post a form here and the browser would send the session's cookie; a
bearer has no such ambient credential). Jupyter's own `_xsrf` check applies on top. WebSockets
follow routes_websockets' rules (a session's upgrade needs our Origin).

What does not go on: hop-by-hop headers both ways; the caller's `Authorization` (replaced by the
session's or the bearer's token); the dashboard's session cookies (`levers9_session`,
`levers9_csrf`) from `Cookie` (Jupyter's own, `_xsrf` and the like, pass). Answers come back as
they are, streamed (status, body, headers, `Set-Cookie` included).
"""

from __future__ import annotations

import re
from typing import get_args

from fastapi import APIRouter, Request, Response, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from starlette.background import BackgroundTask

from levers9.contracts.spec import Name
from levers9.runtime.ws_rules import cross_site_upgrade, without_cookies

from .auth import NOT_SIGNED_IN, Caller, Refused, caller, own_origin
from .routes_websockets import SESSION_COOKIES, deny, proxy, raw_path
from .site import signin_url
from .upstream import Upstream

router = APIRouter()

NAME = re.compile(get_args(Name)[1].pattern)  # a deployment's name, as the gateway's spec has it
METHODS = ["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade"})
# httpx sets Host; the token is the session's; our own server has answered Expect: 100-continue
NOT_SENT = HOP_BY_HOP | {"host", "authorization", "expect"}


def box_path(name: str, raw: str) -> str:
    """The gateway's path for the raw path `/nb/NAME/REST`: `/box/NAME/nb/NAME/REST`. Refused (404)
    for a name no deployment can have, a name written percent-encoded, and a `.` or `..` segment:
    the HTTP client resolves those before sending, so `/nb/x/../../../../api/v1/...` would reach the
    gateway's own API with the session's token."""
    if not NAME.fullmatch(name):
        raise Refused(404, f"no notebook {name!r}: a notebook's name is its box deployment's "
                           "(lowercase letters, digits and '-', at most 63)")
    prefix = f"/nb/{name}/"
    if not raw.startswith(prefix):
        raise Refused(404, f"no notebook at {raw!r}: write the notebook's name as it is, not percent-encoded")
    if any(segment in (".", "..") for segment in raw[len(prefix):].split("/")):
        raise Refused(404, f"no notebook path {raw!r}: a path with a dot segment ('.' or '..') is not passed on")
    return f"/box/{name}{raw}"


def foreign_page(request: Request) -> str:
    """Why a request is not known to come from this dashboard's own pages ("" when it is): its
    Origin must be ours; without one, Sec-Fetch-Site must say same-origin; with neither, it is
    refused (a browser sends one of them with every change)."""
    origin = request.headers.get("origin")
    if origin is not None:
        return cross_site_upgrade(origin, own_origin(request))
    site = request.headers.get("sec-fetch-site")
    if site is None:
        return "it has neither Origin nor Sec-Fetch-Site"
    return "" if site == "same-origin" else f"Sec-Fetch-Site is {site!r}"


def check_change(request: Request, who: Caller) -> None:
    """A cookie's change (not GET, HEAD, OPTIONS) must come from our own pages: a page of any site
    could post a form here and the browser would send our cookie. A bearer has no such credential."""
    if who.via != "cookie" or request.method in SAFE_METHODS:
        return
    why = foreign_page(request)
    if why:
        raise Refused(403, f"refused: a change to a notebook with this dashboard's session must come from "
                           f"its own pages ({why}); reload the notebook from the dashboard")


def dropped(headers: list[tuple[str, str]], always: frozenset[str]) -> frozenset[str]:
    """The header names not passed on: `always`, and those the Connection header names."""
    named = {n.strip().lower() for k, v in headers if k.lower() == "connection" for n in v.split(",")}
    return always | named


def request_headers(request: Request) -> dict[str, str]:
    """The caller's headers (Starlette's names, lowercase) that go on to the gateway."""
    items = request.headers.items()
    skip = dropped(items, NOT_SENT)
    out: dict[str, str] = {}
    for name, value in items:
        if name in skip:
            continue
        if name == "cookie":
            value = without_cookies(value, SESSION_COOKIES)
            if not value:
                continue
        out[name] = f"{out[name]}{'; ' if name == 'cookie' else ', '}{value}" if name in out else value
    out.setdefault("accept-encoding", "identity")  # else httpx asks for gzip the caller may not read
    return out


def answer_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    skip = dropped([(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw], HOP_BY_HOP)
    return [(k.lower(), v) for k, v in raw if k.decode("latin-1").lower() not in skip]


def not_signed_in(request: Request) -> Response:
    """A browser's page is sent to sign in (and back here after); anything else is told why."""
    if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
        return RedirectResponse(signin_url(request), status_code=303)
    return JSONResponse({"detail": NOT_SIGNED_IN}, status_code=401)


async def forward(request: Request, token: str, path: str) -> Response:
    """The request to the gateway's `path`, its body streamed there and the answer streamed back."""
    upstream: Upstream = request.app.state.upstream
    query = request.url.query
    has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
    answer = await upstream.open_stream(request.method, token, path + (f"?{query}" if query else ""),
                                        headers=request_headers(request),
                                        content=request.stream() if has_body else None)
    response = StreamingResponse(answer.aiter_raw(), status_code=answer.status_code,
                                 background=BackgroundTask(answer.aclose))
    response.raw_headers = answer_headers(answer.headers.raw)
    return response


@router.api_route("/nb/{name}", methods=METHODS, include_in_schema=False)
async def notebook_root(name: str, request: Request) -> Response:
    box_path(name, f"/nb/{name}/")
    query = request.url.query
    return RedirectResponse(f"/nb/{name}/" + (f"?{query}" if query else ""), status_code=307)


@router.api_route("/nb/{name}/{rest:path}", methods=METHODS, include_in_schema=False)
async def notebook(name: str, rest: str, request: Request) -> Response:
    path = box_path(name, raw_path(request.scope))
    who = await caller(request)
    if who is None:
        return not_signed_in(request)
    check_change(request, who)
    return await forward(request, who.token, path)


@router.websocket("/nb/{name}/{rest:path}")
async def notebook_socket(websocket: WebSocket, name: str, rest: str) -> None:
    """A kernel's channels (subprotocol v1.kernel.websocket.jupyter.org or none) and Jupyter's other
    sockets: relayed as /box/... is, so with the same session, Origin and cookie rules."""
    try:
        path = box_path(name, raw_path(websocket.scope))
    except Refused as exc:
        return await deny(websocket, exc.status, exc.detail)
    await proxy(websocket, path)
