"""Who is calling: a bearer token, known from TokenCreated/TokenRevoked events.

Only a token's sha256 is in the log and in the gateway's tables. A workspace token may call the
user API; a worker token (scope `worker:<id>`) only the internal routes; platform objects (workers)
need a token of the admin workspace.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException
from starlette.requests import HTTPConnection

from levers9.runtime.tokens import token_hash

from .callers import Caller
from .state import Gateway as GatewayState

ADMIN_WORKSPACE = "default"
MISSING = ("missing bearer token: send 'Authorization: Bearer <token>' "
           "(levers9 up writes one to ~/.levers9/config.toml)")
UNKNOWN = "this token is unknown or revoked: create one with `levers9 token create`"
CHALLENGE = {"WWW-Authenticate": "Bearer"}


def bearer_secret(header: str) -> str:
    """The secret of an `Authorization: Bearer <secret>` header; "" when there is none."""
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer":
        return ""
    return secret.strip()


def user_refusal(caller: Caller) -> str:
    """Why this caller may not use the user API ("" when it may)."""
    return "" if caller.scope == "workspace" else "a worker token cannot call the user API"


def admin_refusal(caller: Caller) -> str:
    """Why this caller may not act on platform objects ("" when it may)."""
    refusal = user_refusal(caller)
    if refusal:
        return refusal
    if caller.workspace != ADMIN_WORKSPACE:
        return f"workers are platform objects: use a token of workspace {ADMIN_WORKSPACE!r}"
    return ""


def worker_of(caller: Caller) -> str:
    """The worker id a worker token stands for; "" for any other token."""
    kind, _, worker_id = caller.scope.partition(":")
    return worker_id if kind == "worker" else ""


async def lookup(gw: GatewayState, secret: str) -> Caller | None:
    """The caller a token secret stands for; None when it is unknown or revoked."""
    digest = token_hash(secret)
    found = gw.tokens.get(digest)
    if found is None:
        row = await gw.pool.fetchrow("SELECT token_id, workspace, scope FROM gateway.tokens "
                                     "WHERE token_sha256 = $1 AND NOT revoked", digest)
        if row is None:
            return None
        found = gw.tokens[digest] = Caller(workspace=row["workspace"], token_id=row["token_id"], scope=row["scope"])
    return found


async def caller(conn: HTTPConnection) -> Caller:
    """The bearer token's caller, for an HTTP request and a WebSocket upgrade alike (a refusal
    before a WebSocket is accepted is its HTTP answer: 401). `user` and `admin` call it rather than
    depend on it: each level of FastAPI dependencies is solved again on every request (warm calls)."""
    secret = bearer_secret(conn.headers.get("authorization", ""))
    if not secret:
        raise HTTPException(401, MISSING, headers=CHALLENGE)
    found = await lookup(conn.app.state.gateway, secret)
    if found is None:
        raise HTTPException(401, UNKNOWN, headers=CHALLENGE)
    return found


AnyCaller = Annotated[Caller, Depends(caller)]


async def user(conn: HTTPConnection) -> Caller:
    c = await caller(conn)
    refusal = user_refusal(c)
    if refusal:
        raise HTTPException(403, refusal)
    return c


async def admin(conn: HTTPConnection) -> Caller:
    c = await caller(conn)
    refusal = admin_refusal(c)
    if refusal:
        raise HTTPException(403, refusal)
    return c


User = Annotated[Caller, Depends(user)]
Admin = Annotated[Caller, Depends(admin)]
