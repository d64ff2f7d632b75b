"""Tokens and secrets of a workspace, and who the caller is.

A token is minted by `levers9.runtime.tokens` (the one place): its secret is shown once, here, and
only its sha256 enters the log. A secret's value is sealed (AES-256-GCM under a fresh data key
wrapped by the keyring's primary KEK, bound to its workspace and name; levers9.runtime.secrets)
before it is appended; no answer and no error here ever holds a value.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field

from levers9.contracts import events as E
from levers9.runtime import sealing
from levers9.runtime.secrets import SecretKeyMissing, SecretUnreadable, encrypt, keyring, rewrap
from levers9.runtime.tokens import mint

from .auth import Admin, AnyCaller, Caller, User
from .deps import Gateway
from .state import row_json

router = APIRouter()


class NoEchoRoute(APIRoute):
    """A route whose validation errors leave out the input they refused: FastAPI's default 422
    quotes it, and the input of a secrets route is a secret's value."""

    def get_route_handler(self):  # type: ignore[no-untyped-def]
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                raise HTTPException(422, [{k: v for k, v in e.items() if k in ("type", "loc", "msg")}
                                          for e in exc.errors()]) from None
        return route


secrets_router = APIRouter(route_class=NoEchoRoute)


class TokenRequest(BaseModel):
    name: str = Field("", max_length=200)


class SecretRequest(BaseModel):
    name: str = Field(..., pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
    value: str  # its length is checked in the route: a validation error would echo the value

MAX_SECRET_BYTES = 65536


@router.get("/api/v1/whoami")
async def whoami(caller: AnyCaller) -> Caller:
    return caller


@router.post("/api/v1/tokens", status_code=201)
async def create_token(body: TokenRequest, caller: User, gw: Gateway) -> dict[str, Any]:
    minted = mint(body.name)
    await gw.publish(minted.event, caller.workspace)
    return {"token_id": minted.token_id, "token": minted.secret, "workspace": caller.workspace}


@router.get("/api/v1/tokens")
async def list_tokens(caller: User, gw: Gateway) -> list[dict[str, Any]]:
    rows = await gw.pool.fetch("SELECT token_id, name, revoked, created_at, scope FROM gateway.tokens "
                               "WHERE workspace=$1 ORDER BY created_at", caller.workspace)
    return [row_json(r) for r in rows]


@router.delete("/api/v1/tokens/{token_id}")
async def revoke_token(token_id: str, caller: User, gw: Gateway) -> dict[str, Any]:
    if await gw.pool.fetchval("SELECT 1 FROM gateway.tokens WHERE workspace=$1 AND token_id=$2",
                              caller.workspace, token_id) is None:
        raise HTTPException(404, f"no token {token_id!r} in workspace {caller.workspace!r}")
    await gw.publish(E.TokenRevoked(token_id=token_id), caller.workspace)
    return {"token_id": token_id, "revoked": True}


@secrets_router.post("/api/v1/secrets", status_code=201)
async def set_secret(body: SecretRequest, caller: User, gw: Gateway) -> dict[str, Any]:
    if len(body.value.encode()) > MAX_SECRET_BYTES:
        raise HTTPException(422, f"the value of secret {body.name!r} is {len(body.value.encode())} bytes; "
                                 f"the limit is {MAX_SECRET_BYTES}")
    try:
        ciphertext = encrypt(gw.settings, caller.workspace, body.name, body.value)
    except SecretKeyMissing as exc:
        raise HTTPException(503, str(exc)) from None
    await gw.publish(E.SecretSet(name=body.name, ciphertext=ciphertext), caller.workspace)
    return {"name": body.name}


@secrets_router.get("/api/v1/secrets")
async def list_secrets(caller: User, gw: Gateway) -> list[dict[str, Any]]:
    rows = await gw.pool.fetch("SELECT name, updated_at FROM gateway.secrets WHERE workspace=$1 ORDER BY name",
                               caller.workspace)
    return [row_json(r) for r in rows]


@secrets_router.delete("/api/v1/secrets/{name}")
async def delete_secret(name: str, caller: User, gw: Gateway) -> dict[str, Any]:
    if await gw.pool.fetchval("SELECT 1 FROM gateway.secrets WHERE workspace=$1 AND name=$2",
                              caller.workspace, name) is None:
        raise HTTPException(404, f"no secret {name!r} in workspace {caller.workspace!r}")
    await gw.publish(E.SecretDeleted(name=name), caller.workspace)
    return {"name": name, "deleted": True}


def _key_ids(rows: list[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        try:
            kid = sealing.value_key_id(r["ciphertext"])
        except sealing.SealError:
            kid = "unreadable"  # e.g. a Fernet value of an older levers9
        counts[kid] = counts.get(kid, 0) + 1
    return counts


@secrets_router.get("/api/v1/secrets/keys")
async def secret_keys(caller: Admin, gw: Gateway) -> dict[str, Any]:
    """The gateway's keyring (ids only) and how many stored secrets, of all workspaces, each key
    wraps: a key may be retired once it wraps none."""
    try:
        ring = keyring(gw.settings)
    except SecretKeyMissing as exc:
        raise HTTPException(503, str(exc)) from None
    rows = await gw.pool.fetch("SELECT ciphertext FROM gateway.secrets")
    return {"primary": ring.primary, "keys": sorted(ring.keys), "by_key": _key_ids(rows)}


@secrets_router.post("/api/v1/secrets/rewrap")
async def rewrap_secrets(caller: Admin, gw: Gateway) -> dict[str, Any]:
    """Rewrap every stored secret (all workspaces) whose data key is not under the primary KEK:
    a SecretSet with the same sealed value, its data key wrapped anew. Values stay sealed."""
    try:
        ring = keyring(gw.settings)
    except SecretKeyMissing as exc:
        raise HTTPException(503, str(exc)) from None
    rows = await gw.pool.fetch("SELECT workspace, name, ciphertext FROM gateway.secrets ORDER BY workspace, name")
    done, failed = 0, []
    for r in rows:
        try:
            token = rewrap(gw.settings, r["workspace"], r["name"], r["ciphertext"])
        except SecretUnreadable as exc:
            failed.append({"workspace": r["workspace"], "name": r["name"], "reason": str(exc)})
            continue
        if token != r["ciphertext"]:
            await gw.publish(E.SecretSet(name=r["name"], ciphertext=token), r["workspace"])
            done += 1
    return {"primary": ring.primary, "secrets": len(rows), "rewrapped": done, "failed": failed}


router.include_router(secrets_router)
