"""Who is calling, and whether a change may be made.

A caller is a browser with a session cookie (sessions.Sealer opens it) or a program with
`Authorization: Bearer <token>`, which the gateway checks (whoami, cached). Either way the caller's
own token goes to the gateway on every call it causes, so every answer is scoped to its workspace
by the gateway itself.

Changes (POST, DELETE) from a browser are protected against cross-site requests twice: the header
`X-CSRF-Token` must equal the session's CSRF token (also in the readable cookie `levers9_csrf`,
double-submit), and an `Origin` (or `Sec-Fetch-Site`), when the browser sends one, must be this
dashboard's own. A bearer request carries no ambient credential a cross-site page could borrow, so it
needs only the Origin check.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Request

from .sessions import CSRF_COOKIE, SESSION_COOKIE, Sealer
from .upstream import Upstream


@dataclass(frozen=True)
class Caller:
    token: str
    workspace: str
    via: str  # "cookie" | "bearer"
    csrf: str = ""


class Refused(Exception):
    """A request refused: `status` and a sentence that says why and what to do."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


NOT_SIGNED_IN = "not signed in: run `levers9 dashboard` for a sign-in link, or send Authorization: Bearer <token>"


def bearer(request: Request) -> str:
    value = request.headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def caller(request: Request, *, cookie: bool = True) -> Caller | None:
    """The caller, or None when it has neither a valid session nor a token the gateway accepts."""
    sealer: Sealer = request.app.state.sealer
    upstream: Upstream = request.app.state.upstream
    token = bearer(request)
    if token:
        who = await upstream.whoami(token)
        if who is None or who.get("scope", "workspace") != "workspace":
            return None
        return Caller(token=token, workspace=str(who["workspace"]), via="bearer")
    if not cookie:
        return None
    session = sealer.open(request.cookies.get(SESSION_COOKIE))
    if session is None:
        return None
    return Caller(token=session.token, workspace=session.workspace, via="cookie", csrf=session.csrf)


def own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"


def cross_site(request: Request) -> str:
    """Why this request comes from another site, or "" when it does not (or cannot be told)."""
    origin = request.headers.get("origin")
    if origin is not None and origin != own_origin(request):
        return f"Origin {origin!r} is not this dashboard ({own_origin(request)})"
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return f"Sec-Fetch-Site is {request.headers['sec-fetch-site']!r}"
    return ""


def check_change(request: Request, who: Caller | None) -> None:
    """Raise Refused(403) unless this change may be made by `who` (None: signing in)."""
    why = cross_site(request)
    if why:
        raise Refused(403, f"refused: a change must come from this dashboard's own pages ({why}).")
    if who is not None and who.via == "bearer":
        return
    sent = request.headers.get("x-csrf-token", "")
    expected = who.csrf if who is not None else request.cookies.get(CSRF_COOKIE, "")
    if not sent or not expected or not hmac.compare_digest(sent, expected):
        raise Refused(403, "refused: the header X-CSRF-Token must equal the levers9_csrf cookie "
                           "(reload the page to get one).")
