"""The gateway process: the REST API under /api/v1 with workspace bearer tokens.

Tokens are known from TokenCreated/TokenRevoked events (only their sha256 is in the log and in the
gateway's tokens table). Objects of another workspace answer 404, never 403, so their existence
does not leak.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from levers9.contracts import InvalidName, check_id, envelope, uuid7
from levers9.contracts import events as E
from levers9.runtime.service import Service
from levers9.runtime.views import ContainersView, DeploymentsView, TokensView, WorkersView


class Caller(BaseModel):
    workspace: str
    token_id: str


class ContainerRequest(BaseModel):
    cpu: float = Field(1.0, gt=0, le=256, description="cores")
    memory: int = Field(1024, gt=0, le=4 * 1024 * 1024, description="MiB")
    gpu: list[str] = Field(default_factory=list, description="GPU types in order of preference")
    gpu_count: int = Field(0, ge=0, le=16)
    pool: str = "default"
    deployment_id: str = ""
    image: str = ""


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class GatewayService(Service):
    name = "gateway"
    projections = (TokensView(), DeploymentsView(), ContainersView(), WorkersView())

    async def caller(self, request: Request) -> Caller:
        header = request.headers.get("authorization", "")
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret:
            raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <token>' "
                                     "(levers9 up writes one to ~/.levers9/config.toml)",
                                headers={"WWW-Authenticate": "Bearer"})
        row = await self.pool.fetchrow(
            "SELECT token_id, workspace FROM gateway.tokens WHERE token_sha256 = $1 AND NOT revoked",
            token_hash(secret.strip()))
        if row is None:
            raise HTTPException(401, "this token is unknown or revoked: create one with `levers9 token create`",
                                headers={"WWW-Authenticate": "Bearer"})
        return Caller(workspace=row["workspace"], token_id=row["token_id"])

    def routes(self, app: FastAPI) -> None:
        caller_dep = Depends(self.caller)

        @app.get("/api/v1/whoami")
        async def whoami(caller: Caller = caller_dep) -> Caller:
            return caller

        @app.get("/api/v1/containers")
        async def list_containers(caller: Caller = caller_dep) -> list[dict[str, Any]]:
            rows = await self.pool.fetch(
                "SELECT * FROM gateway.containers WHERE workspace = $1 ORDER BY updated_at DESC LIMIT 1000",
                caller.workspace)
            return [_row(r) for r in rows]

        @app.get("/api/v1/containers/{container_id}")
        async def get_container(container_id: str, caller: Caller = caller_dep) -> dict[str, Any]:
            row = await self.pool.fetchrow(
                "SELECT * FROM gateway.containers WHERE workspace = $1 AND container_id = $2",
                caller.workspace, container_id)
            if row is None:
                raise HTTPException(404, f"no container {container_id!r} in workspace {caller.workspace!r}")
            return _row(row)

        @app.post("/api/v1/containers", status_code=202)
        async def request_container(body: ContainerRequest, caller: Caller = caller_dep) -> dict[str, Any]:
            try:
                if body.deployment_id:
                    check_id(body.deployment_id, "deployment_id")
                check_id(body.pool, "pool")
            except InvalidName as exc:
                raise HTTPException(422, str(exc)) from None
            event = E.ContainerRequested(
                container_id=uuid7(), deployment_id=body.deployment_id, image=body.image,
                cpu_millicores=int(body.cpu * 1000), memory_mib=body.memory, gpu=body.gpu,
                gpu_count=body.gpu_count, pool=body.pool, reason="api")
            env = envelope(event, workspace=caller.workspace)
            appended = await self.bus.publish(env)
            return {"container_id": event.container_id, "correlation_id": env.correlation_id,
                    "event_id": env.id, "seq": appended.seq}

        @app.get("/api/v1/workers")
        async def list_workers(caller: Caller = caller_dep) -> list[dict[str, Any]]:
            return [_row(r) for r in await self.pool.fetch("SELECT * FROM gateway.workers ORDER BY worker_id")]


def _row(record: Any) -> dict[str, Any]:
    return msgspec.to_builtins(dict(record))
