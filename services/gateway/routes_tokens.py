"""Tokens and secrets of a workspace, and who the caller is.

A token is minted by `levers9.runtime.tokens` (the one place): its secret is shown once, here, and
only its sha256 enters the log. A secret's value is encrypted before it is appended.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field

from levers9.contracts import events as E
from levers9.runtime.secrets import SecretKeyMissing, encrypt
from levers9.runtime.tokens import mint

from .auth import AnyCaller, Caller, User
from .deps import Gateway
from .state import row_json

router = APIRouter()


class TokenRequest(BaseModel):
    name: str = Field("", max_length=200)


class SecretRequest(BaseModel):
    name: str = Field(..., pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
    value: str = Field(..., max_length=65536)


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


@router.post("/api/v1/secrets", status_code=201)
async def set_secret(body: SecretRequest, caller: User, gw: Gateway) -> dict[str, Any]:
    try:
        ciphertext = encrypt(gw.settings.secret_key, body.value)
    except SecretKeyMissing as exc:
        raise HTTPException(503, str(exc)) from None
    await gw.publish(E.SecretSet(name=body.name, ciphertext=ciphertext), caller.workspace)
    return {"name": body.name}


@router.get("/api/v1/secrets")
async def list_secrets(caller: User, gw: Gateway) -> list[dict[str, Any]]:
    rows = await gw.pool.fetch("SELECT name, updated_at FROM gateway.secrets WHERE workspace=$1 ORDER BY name",
                               caller.workspace)
    return [row_json(r) for r in rows]


@router.delete("/api/v1/secrets/{name}")
async def delete_secret(name: str, caller: User, gw: Gateway) -> dict[str, Any]:
    if await gw.pool.fetchval("SELECT 1 FROM gateway.secrets WHERE workspace=$1 AND name=$2",
                              caller.workspace, name) is None:
        raise HTTPException(404, f"no secret {name!r} in workspace {caller.workspace!r}")
    await gw.publish(E.SecretDeleted(name=name), caller.workspace)
    return {"name": name, "deleted": True}
