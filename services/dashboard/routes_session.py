"""Signing in and out.

`levers9 dashboard` asks `POST /api/session/tickets` (with the profile's token) for a one-time URL;
`GET /signin?ticket=…` redeems it, sets the session cookie and the CSRF cookie, and sends the browser
to `/`. The sign-in page's paste box posts the token to `POST /api/session` instead. A ticket that is
unknown, used or expired is refused with a page that says what to do.
"""

from __future__ import annotations

import datetime as dt
import html
import secrets
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from .auth import NOT_SIGNED_IN, Caller, Refused, bearer, caller, check_change
from .sessions import CSRF_COOKIE, SESSION_COOKIE, SESSION_TTL_S, Sealer, Tickets
from .upstream import Upstream

router = APIRouter()


def set_session(request: Request, response: Response, token: str, workspace: str) -> None:
    sealer: Sealer = request.app.state.sealer
    sealed, session = sealer.seal(token, workspace)
    secure = request.url.scheme == "https"
    response.set_cookie(SESSION_COOKIE, sealed, max_age=SESSION_TTL_S, path="/", httponly=True,
                        samesite="strict", secure=secure)
    response.set_cookie(CSRF_COOKIE, session.csrf, max_age=SESSION_TTL_S, path="/", httponly=False,
                        samesite="strict", secure=secure)


def ensure_csrf_cookie(request: Request, response: Response) -> None:
    """A page served before sign-in gets a CSRF cookie, so its sign-in form can send the header."""
    if not request.cookies.get(CSRF_COOKIE):
        response.set_cookie(CSRF_COOKIE, secrets.token_urlsafe(24), path="/", httponly=False, samesite="strict",
                            secure=request.url.scheme == "https")


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@router.post("/api/session/tickets", status_code=201)
async def create_ticket(request: Request) -> Any:
    """A one-time sign-in URL for the bearer token's workspace (what `levers9 dashboard` prints)."""
    token = bearer(request)
    who = await caller(request, cookie=False) if token else None
    if who is None:
        return JSONResponse({"detail": "send Authorization: Bearer <a token of your workspace> "
                                       "(the profile's token: `levers9 dashboard` does)"}, status_code=401)
    check_change(request, who)
    tickets: Tickets = request.app.state.tickets
    ticket, expires = tickets.issue(who.token, who.workspace)
    base = str(request.base_url).rstrip("/")
    return {"url": f"{base}/signin?ticket={ticket}", "expires_at": iso(expires), "workspace": who.workspace}


def refused_page(message: str, status: int) -> HTMLResponse:
    body = (f"<!doctype html><html><head><meta charset=utf-8><title>levers9: sign-in refused</title></head>"
            f"<body><h1>Sign-in refused</h1><p>{html.escape(message)}</p>"
            f"<p>Run <code>levers9 dashboard</code> for a new link, or <a href=\"/signin/\">paste a token</a>.</p>"
            f"</body></html>")
    return HTMLResponse(body, status_code=status)


@router.get("/signin")
async def signin(request: Request, ticket: str = "") -> Response:
    if not ticket:
        return RedirectResponse("/signin/", status_code=307)
    tickets: Tickets = request.app.state.tickets
    found = tickets.redeem(ticket)
    if found is None:
        return refused_page("This sign-in link is unknown, already used or expired (a link works once, "
                            "for two minutes).", 401)
    response = RedirectResponse("/", status_code=303)
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"  # the ticket in the URL goes nowhere else
    set_session(request, response, found.token, found.workspace)
    return response


@router.post("/api/session")
async def sign_in_with_token(request: Request) -> Response:
    """The sign-in page's paste box: JSON or form `{"token": …}`."""
    check_change(request, None)
    if request.headers.get("content-type", "").startswith("application/json"):
        body = await request.json()
        token = str(body.get("token", "")) if isinstance(body, dict) else ""
    else:
        token = str((await request.form()).get("token", ""))
    token = token.strip()
    upstream: Upstream = request.app.state.upstream
    who = await upstream.whoami(token) if token else None
    if who is None or who.get("scope", "workspace") != "workspace":
        return JSONResponse({"detail": "the gateway does not accept this token (revoked, mistyped, or a "
                                       "worker's); create one with `levers9 tokens create`"}, status_code=401)
    response = JSONResponse({"workspace": who["workspace"]})
    set_session(request, response, token, str(who["workspace"]))
    return response


@router.delete("/api/session")
async def sign_out(request: Request) -> Response:
    who = await caller(request)
    check_change(request, who)
    response = JSONResponse({"signed_out": True})
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(CSRF_COOKIE, path="/")
    return response


@router.get("/api/me")
async def me(request: Request) -> Any:
    who: Caller | None = await caller(request)
    if who is None:
        raise Refused(401, NOT_SIGNED_IN)
    return {"workspace": who.workspace, "gateway_url": request.app.state.upstream.base_url, "via": who.via}
