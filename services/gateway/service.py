"""The gateway process: the REST API under /api/v1 and invocation at /endpoint/{name}.

Tokens are known from TokenCreated/TokenRevoked events (only their sha256 is in the log and in the
gateway's tables). Objects of another workspace answer 404, never 403, so their existence does not
leak. Invocation: resolve the deployment, take a slot on a ready container (router.py), proxy the
request (any method, sub-path, query, headers, streamed body) and stream the answer back.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import re
import secrets as pysecrets
import tarfile
from typing import Any

import aiohttp
import httpx
import msgspec
import yarl
from aiobotocore.session import get_session
from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, ValidationError

from levers9.contracts import InvalidName, check_id, envelope, uuid7
from levers9.contracts import events as E
from levers9.runtime.bus import ConcurrencyConflict
from levers9.runtime.consumer import Delivery
from levers9.runtime.projection import Projection
from levers9.runtime.secrets import SecretKeyMissing, encrypt
from levers9.runtime.service import Service
from levers9.runtime.views import (CheckpointsView, ContainersView, DeploymentsView, SecretsView, TokensView,
                                   WorkersView)

from .router import DeploymentRouter, NoCapacity, StartFailed

log = logging.getLogger("levers9.gateway")

ADMIN_WORKSPACE = "default"
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "authorization", "content-length"}
VERSION_RE = re.compile(r"^v(\d+)$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
MAX_CODE_BYTES = 16 * 1024 * 1024


class Caller(BaseModel):
    workspace: str
    token_id: str
    scope: str = "workspace"


class ContainerRequest(BaseModel):
    cpu: float = Field(1.0, gt=0, le=256, description="cores")
    memory: int = Field(1024, gt=0, le=4 * 1024 * 1024, description="MiB")
    gpu: list[str] = Field(default_factory=list, description="GPU types in order of preference")
    gpu_count: int = Field(0, ge=0, le=16)
    pool: str = "default"
    deployment_id: str = ""
    image: str = ""


class DeploySpec(BaseModel):
    name: str
    kind: str = Field("endpoint", pattern="^(endpoint|asgi)$")
    module: str = Field(..., pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    handler: str = Field(..., pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    on_start: str = Field("", pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")
    cpu_millicores: int = Field(1000, gt=0, le=256000)
    memory_mib: int = Field(1024, ge=16, le=4 * 1024 * 1024)
    gpu: list[str] = Field(default_factory=list)
    gpu_count: int = Field(0, ge=0, le=16)
    image: dict | None = None
    keep_warm_seconds: int = Field(60, ge=0, le=86400)
    min_containers: int = Field(0, ge=0, le=100)
    max_containers: int = Field(1, ge=1, le=1000)
    concurrency: int = Field(1, ge=1, le=10000)
    timeout_seconds: int = Field(180, ge=1, le=86400)
    secrets: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    checkpoint_enabled: bool = False
    pool: str = "default"
    app_name: str = ""


class TokenRequest(BaseModel):
    name: str = Field("", max_length=200)


class SecretRequest(BaseModel):
    name: str = Field(..., pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
    value: str = Field(..., max_length=65536)


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _row(record: Any) -> dict[str, Any]:
    return msgspec.to_builtins(dict(record))


class GatewayService(Service):
    name = "gateway"
    projections = (TokensView(), DeploymentsView(), ContainersView(), WorkersView(), SecretsView(), CheckpointsView())

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.routers: dict[str, DeploymentRouter] = {}
        self.container_deployment: dict[str, str] = {}
        self.tokens: dict[str, Caller] = {}
        self.deployments: dict[tuple[str, str, str], dict] = {}  # (workspace, name, vN|latest) -> row
        self.http: httpx.AsyncClient | None = None
        self.session: aiohttp.ClientSession | None = None

    async def on_start(self) -> None:
        self.http = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=2000,
                                                                         max_keepalive_connections=500))
        # the proxy hop: aiohttp's pool hands out a keep-alive connection without scanning the pool
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60),
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None), skip_auto_headers=("User-Agent",))
        for r in await self.pool.fetch("SELECT container_id, deployment_id FROM gateway.containers "
                                       "WHERE status NOT IN ('stopped', 'failed')"):
            self.container_deployment[r["container_id"]] = r["deployment_id"]

    async def on_stop(self) -> None:
        if self.http:
            await self.http.aclose()
        if self.session:
            await self.session.close()

    # ---- projections feed the in-memory routing state --------------------------------------------

    async def apply(self, p: Projection, batch: list[Delivery]) -> None:
        await super().apply(p, batch)
        if p.name == "tokens":
            self.tokens.clear()
        elif p.name == "deployments":
            self.deployments.clear()
        elif p.name == "containers":
            for d in batch:
                if d.message is not None:
                    await self.route_event(d.message.event)

    async def route_event(self, ev: E.Event) -> None:
        if isinstance(ev, E.ContainerRequested):
            self.container_deployment[ev.container_id] = ev.deployment_id
        dep = self.container_deployment.get(ev.container_id, "")
        router = self.routers.get(dep)
        if router is None:
            return
        status = {"ContainerRequested": "requested", "PlacementDeferred": "pending", "ContainerScheduled": "scheduled",
                  "ContainerStarted": "starting", "ContainerReady": "ready", "ContainerStopRequested": "stopping",
                  "ContainerStopped": "stopped", "ContainerFailed": "failed"}.get(type(ev).__name__)
        if status is None:
            return
        await router.update(ev.container_id, status, getattr(ev, "address", ""), getattr(ev, "reason", ""))

    async def router_for(self, dep: dict) -> DeploymentRouter:
        router = self.routers.get(dep["deployment_id"])
        if router is None:
            spec = dep["spec"]
            router = DeploymentRouter(dep["deployment_id"], int(spec.get("concurrency", 1)),
                                      int(spec.get("max_containers", 1)))
            rows = await self.pool.fetch(
                "SELECT container_id, status, address FROM gateway.containers WHERE workspace=$1 AND deployment_id=$2 "
                "AND status NOT IN ('stopped', 'failed')", dep["workspace"], dep["deployment_id"])
            for r in rows:
                await router.update(r["container_id"], r["status"], r["address"])
            self.routers[dep["deployment_id"]] = router
        return router

    # ---- auth ------------------------------------------------------------------------------------

    async def caller(self, request: Request) -> Caller:
        header = request.headers.get("authorization", "")
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret:
            raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <token>' "
                                     "(levers9 up writes one to ~/.levers9/config.toml)",
                                headers={"WWW-Authenticate": "Bearer"})
        digest = token_hash(secret.strip())
        found = self.tokens.get(digest)
        if found is None:
            row = await self.pool.fetchrow("SELECT token_id, workspace, scope FROM gateway.tokens "
                                           "WHERE token_sha256 = $1 AND NOT revoked", digest)
            if row is None:
                raise HTTPException(401, "this token is unknown or revoked: create one with `levers9 token create`",
                                    headers={"WWW-Authenticate": "Bearer"})
            found = self.tokens[digest] = Caller(workspace=row["workspace"], token_id=row["token_id"],
                                                 scope=row["scope"])
        return found

    async def user(self, request: Request) -> Caller:
        c = await self.caller(request)
        if c.scope != "workspace":
            raise HTTPException(403, "a worker token cannot call the user API")
        return c

    async def admin(self, request: Request) -> Caller:
        c = await self.user(request)
        if c.workspace != ADMIN_WORKSPACE:
            raise HTTPException(403, f"workers are platform objects: use a token of workspace {ADMIN_WORKSPACE!r}")
        return c

    async def publish(self, event: E.Event, workspace: str, correlation_id: str | None = None):
        env = envelope(event, workspace=workspace, correlation_id=correlation_id)
        return env, await self.bus.publish(env)

    # ---- S3 --------------------------------------------------------------------------------------

    def s3(self):
        s = self.settings
        return get_session().create_client("s3", endpoint_url=s.s3_endpoint, aws_access_key_id=s.s3_access_key,
                                           aws_secret_access_key=s.s3_secret_key, region_name=s.s3_region)

    async def put_code(self, workspace: str, data: bytes) -> tuple[str, str]:
        sha = hashlib.sha256(data).hexdigest()
        bucket, key = f"levers9-{workspace}", f"code/{sha}.tar.gz"
        async with self.s3() as client:
            try:
                await client.head_bucket(Bucket=bucket)
            except Exception:  # noqa: BLE001 - missing: create it
                await client.create_bucket(Bucket=bucket)
            await client.put_object(Bucket=bucket, Key=key, Body=data)
        return sha, key

    # ---- routes ----------------------------------------------------------------------------------

    def routes(self, app: FastAPI) -> None:
        from fastapi import Depends

        user = Depends(self.user)
        admin = Depends(self.admin)
        any_caller = Depends(self.caller)

        @app.get("/api/v1/whoami")
        async def whoami(caller: Caller = any_caller) -> Caller:
            return caller

        # deployments
        @app.post("/api/v1/deployments", status_code=201)
        async def deploy(request: Request, spec: str = Form(...), code: UploadFile = File(...),
                         caller: Caller = user) -> dict[str, Any]:
            try:
                body = DeploySpec.model_validate_json(spec)
            except ValidationError as exc:
                raise HTTPException(422, f"the deployment spec is not valid: {exc.errors()[0]['loc']}: "
                                         f"{exc.errors()[0]['msg']}") from None
            if not NAME_RE.fullmatch(body.name):
                raise HTTPException(422, f"endpoint name {body.name!r} is not valid: use lowercase letters, "
                                         "digits and '-' (rename the function or pass name=...)")
            data = await code.read(MAX_CODE_BYTES + 1)
            if len(data) > MAX_CODE_BYTES:
                raise HTTPException(413, f"the code archive is over {MAX_CODE_BYTES >> 20} MiB: deploy less "
                                         "(large data belongs in an image or a volume)")
            check_archive(data, body.module)
            sha, key = await self.put_code(caller.workspace, data)
            return await self.create_deployment(caller.workspace, body, sha, key, str(request.base_url))

        @app.get("/api/v1/deployments")
        async def list_deployments(caller: Caller = user) -> list[dict[str, Any]]:
            rows = await self.pool.fetch("SELECT deployment_id, name, version, status, created_at, spec "
                                         "FROM gateway.deployments WHERE workspace=$1 AND status <> 'deleted' "
                                         "ORDER BY name, version", caller.workspace)
            return [{**_row(r), "spec": json.loads(r["spec"])} for r in rows]

        @app.post("/api/v1/deployments/{name}/stop")
        async def stop_deployment(name: str, caller: Caller = user) -> dict[str, Any]:
            return await self.end_deployment(caller.workspace, name, delete=False)

        @app.delete("/api/v1/deployments/{name}")
        async def delete_deployment(name: str, caller: Caller = user) -> dict[str, Any]:
            return await self.end_deployment(caller.workspace, name, delete=True)

        # containers
        @app.get("/api/v1/containers")
        async def list_containers(caller: Caller = user, all: bool = False) -> list[dict[str, Any]]:
            rows = await self.pool.fetch(
                "SELECT c.*, d.name AS deployment_name FROM gateway.containers c LEFT JOIN gateway.deployments d "
                "ON d.workspace = c.workspace AND d.deployment_id = c.deployment_id WHERE c.workspace = $1 "
                "AND ($2 OR c.status NOT IN ('stopped', 'failed')) ORDER BY c.updated_at DESC LIMIT 1000",
                caller.workspace, all)
            return [_row(r) for r in rows]

        @app.get("/api/v1/containers/{container_id}")
        async def get_container(container_id: str, caller: Caller = user) -> dict[str, Any]:
            return _row(await self.container_row(caller.workspace, container_id))

        @app.post("/api/v1/containers", status_code=202)
        async def request_container(body: ContainerRequest, caller: Caller = user) -> dict[str, Any]:
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
            env, appended = await self.publish(event, caller.workspace)
            return {"container_id": event.container_id, "correlation_id": env.correlation_id,
                    "event_id": env.id, "seq": appended.seq}

        @app.post("/api/v1/containers/{container_id}/stop", status_code=202)
        async def stop_container(container_id: str, caller: Caller = user) -> dict[str, Any]:
            row = await self.container_row(caller.workspace, container_id)
            env, _ = await self.publish(E.ContainerStopRequested(container_id=container_id, reason="stopped by user"),
                                        caller.workspace, row["correlation_id"])
            return {"container_id": container_id, "correlation_id": env.correlation_id}

        @app.get("/api/v1/containers/{container_id}/logs")
        async def container_logs(container_id: str, follow: bool = False, caller: Caller = user):
            row = await self.container_row(caller.workspace, container_id)
            worker = await self.pool.fetchrow("SELECT address FROM gateway.workers WHERE worker_id=$1", row["worker_id"])
            if worker is None or not worker["address"]:
                raise HTTPException(404, f"container {container_id} has no logs yet (not placed on a worker)")
            upstream = self.http.build_request("GET", f"{worker['address']}/containers/{container_id}/logs",
                                               params={"follow": str(follow).lower()})
            try:
                resp = await self.http.send(upstream, stream=True)
            except httpx.HTTPError as exc:
                raise HTTPException(502, f"worker {row['worker_id']} does not answer: {exc}") from None
            if resp.status_code != 200:
                await resp.aclose()
                raise HTTPException(resp.status_code, f"worker {row['worker_id']} has no log for {container_id}")
            return StreamingResponse(resp.aiter_raw(), media_type="text/plain", background=_closer(resp))

        # workers
        @app.get("/api/v1/workers")
        async def list_workers(caller: Caller = user) -> list[dict[str, Any]]:
            return [_row(r) for r in await self.pool.fetch("SELECT * FROM gateway.workers ORDER BY worker_id")]

        @app.post("/api/v1/workers/{worker_id}/{action}", status_code=202)
        async def worker_action(worker_id: str, action: str, caller: Caller = admin) -> dict[str, Any]:
            if await self.pool.fetchval("SELECT 1 FROM gateway.workers WHERE worker_id=$1", worker_id) is None:
                raise HTTPException(404, f"no worker {worker_id!r}: see `levers9 workers list`")
            events = {"cordon": E.WorkerCordoned(worker_id=worker_id), "drain": E.WorkerCordoned(worker_id=worker_id,
                                                                                                   drain=True),
                      "uncordon": E.WorkerUncordoned(worker_id=worker_id)}
            if action not in events:
                raise HTTPException(404, f"unknown action {action!r}: use cordon, drain or uncordon")
            await self.publish(events[action], "_sys")
            return {"worker_id": worker_id, "action": action}

        # checkpoints
        @app.get("/api/v1/checkpoints")
        async def list_checkpoints(caller: Caller = user, all: bool = False) -> list[dict[str, Any]]:
            rows = await self.pool.fetch(
                "SELECT * FROM gateway.checkpoints WHERE workspace=$1 AND ($2 OR status <> 'deleted') "
                "ORDER BY created_at DESC", caller.workspace, all)
            return [_row(r) for r in rows]

        @app.delete("/api/v1/checkpoints/{checkpoint_id}")
        async def delete_checkpoint(checkpoint_id: str, caller: Caller = user) -> dict[str, Any]:
            status = await self.pool.fetchval("SELECT status FROM gateway.checkpoints WHERE workspace=$1 AND "
                                              "checkpoint_id=$2", caller.workspace, checkpoint_id)
            if status is None or status == "deleted":
                raise HTTPException(404, f"no checkpoint {checkpoint_id!r} in workspace {caller.workspace!r}")
            await self.publish(E.CheckpointDeleted(checkpoint_id=checkpoint_id), caller.workspace)
            return {"checkpoint_id": checkpoint_id, "deleted": True}

        @app.post("/api/v1/containers/{container_id}/checkpoint", status_code=202)
        async def checkpoint_container(container_id: str, caller: Caller = user) -> dict[str, Any]:
            row = await self.container_row(caller.workspace, container_id)
            if row["status"] != "ready":
                raise HTTPException(409, f"container {container_id} is {row['status']}: only a ready container "
                                         "can be checkpointed")
            env, _ = await self.publish(E.ContainerCheckpointRequested(container_id=container_id), caller.workspace,
                                        row["correlation_id"])
            return {"container_id": container_id, "correlation_id": env.correlation_id}

        # tokens
        @app.post("/api/v1/tokens", status_code=201)
        async def create_token(body: TokenRequest, caller: Caller = user) -> dict[str, Any]:
            token = "l9_" + pysecrets.token_urlsafe(32)
            token_id = uuid7()
            await self.publish(E.TokenCreated(token_id=token_id, token_sha256=token_hash(token), name=body.name),
                               caller.workspace)
            return {"token_id": token_id, "token": token, "workspace": caller.workspace}

        @app.get("/api/v1/tokens")
        async def list_tokens(caller: Caller = user) -> list[dict[str, Any]]:
            rows = await self.pool.fetch("SELECT token_id, name, revoked, created_at, scope FROM gateway.tokens "
                                         "WHERE workspace=$1 ORDER BY created_at", caller.workspace)
            return [_row(r) for r in rows]

        @app.delete("/api/v1/tokens/{token_id}")
        async def revoke_token(token_id: str, caller: Caller = user) -> dict[str, Any]:
            if await self.pool.fetchval("SELECT 1 FROM gateway.tokens WHERE workspace=$1 AND token_id=$2",
                                        caller.workspace, token_id) is None:
                raise HTTPException(404, f"no token {token_id!r} in workspace {caller.workspace!r}")
            await self.publish(E.TokenRevoked(token_id=token_id), caller.workspace)
            return {"token_id": token_id, "revoked": True}

        # secrets
        @app.post("/api/v1/secrets", status_code=201)
        async def set_secret(body: SecretRequest, caller: Caller = user) -> dict[str, Any]:
            try:
                ciphertext = encrypt(self.settings.secret_key, body.value)
            except SecretKeyMissing as exc:
                raise HTTPException(503, str(exc)) from None
            await self.publish(E.SecretSet(name=body.name, ciphertext=ciphertext), caller.workspace)
            return {"name": body.name}

        @app.get("/api/v1/secrets")
        async def list_secrets(caller: Caller = user) -> list[dict[str, Any]]:
            rows = await self.pool.fetch("SELECT name, updated_at FROM gateway.secrets WHERE workspace=$1 ORDER BY name",
                                         caller.workspace)
            return [_row(r) for r in rows]

        @app.delete("/api/v1/secrets/{name}")
        async def delete_secret(name: str, caller: Caller = user) -> dict[str, Any]:
            if await self.pool.fetchval("SELECT 1 FROM gateway.secrets WHERE workspace=$1 AND name=$2",
                                        caller.workspace, name) is None:
                raise HTTPException(404, f"no secret {name!r} in workspace {caller.workspace!r}")
            await self.publish(E.SecretDeleted(name=name), caller.workspace)
            return {"name": name, "deleted": True}

        # workers fetch code with their own token
        @app.get("/api/v1/internal/deployments/{deployment_id}/code")
        async def code(deployment_id: str, workspace: str, container_id: str, caller: Caller = any_caller):
            if not caller.scope.startswith("worker:"):
                raise HTTPException(403, "only a worker token can fetch code archives")
            worker_id = caller.scope.split(":", 1)[1]
            for _ in range(100):  # the worker may ask before our projection has seen its placement
                row = await self.pool.fetchrow(
                    "SELECT c.worker_id, d.spec FROM gateway.containers c JOIN gateway.deployments d "
                    "ON d.workspace = c.workspace AND d.deployment_id = c.deployment_id "
                    "WHERE c.workspace=$1 AND c.container_id=$2 AND c.deployment_id=$3", workspace, container_id,
                    deployment_id)
                if row is not None and row["worker_id"] == worker_id:
                    break
                await asyncio.sleep(0.05)
            else:
                raise HTTPException(404, f"container {container_id} is not placed on worker {worker_id}")
            spec = json.loads(row["spec"])
            async with self.s3() as client:
                obj = await client.get_object(Bucket=f"levers9-{workspace}", Key=spec["code_key"])
                data = await obj["Body"].read()
            return Response(data, media_type="application/gzip")

        # invocation
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]

        @app.api_route("/endpoint/{name}", methods=methods)
        async def invoke_root(name: str, request: Request, caller: Caller = user):
            return await self.invoke(request, caller, name, "")

        @app.api_route("/endpoint/{name}/{rest:path}", methods=methods)
        async def invoke(name: str, rest: str, request: Request, caller: Caller = user):
            return await self.invoke(request, caller, name, rest)

    # ---- helpers ---------------------------------------------------------------------------------

    async def container_row(self, workspace: str, container_id: str):
        row = await self.pool.fetchrow("SELECT * FROM gateway.containers WHERE workspace=$1 AND container_id=$2",
                                       workspace, container_id)
        if row is None:
            raise HTTPException(404, f"no container {container_id!r} in workspace {workspace!r}")
        return row

    async def create_deployment(self, workspace: str, body: DeploySpec, sha: str, key: str, base: str) -> dict:
        latest = await self.pool.fetchval("SELECT max(version) FROM gateway.deployments WHERE workspace=$1 AND name=$2",
                                          workspace, body.name) or 0
        for version in range(latest + 1, latest + 20):
            event = E.DeploymentCreated(
                deployment_id=f"{body.name}-v{version}", name=body.name, version=version, kind=body.kind,
                handler=body.handler, module=body.module, on_start=body.on_start, cpu_millicores=body.cpu_millicores,
                memory_mib=body.memory_mib, gpu=body.gpu, gpu_count=body.gpu_count,
                keep_warm_seconds=body.keep_warm_seconds, min_containers=body.min_containers,
                max_containers=body.max_containers, concurrency=body.concurrency, timeout_seconds=body.timeout_seconds,
                checkpoint_enabled=body.checkpoint_enabled, pool=body.pool, env=body.env, secrets=body.secrets,
                code_sha256=sha, code_key=key, app_name=body.app_name, image=json.dumps(body.image) if body.image else "")
            try:
                await self.bus.append(envelope(event, workspace=workspace), 0)
            except ConcurrencyConflict:
                continue  # that version was taken by a concurrent deploy
            await self.wait_projected(workspace, event.deployment_id)
            return {"deployment_id": event.deployment_id, "name": body.name, "version": version,
                    "url": f"{base.rstrip('/')}/endpoint/{body.name}"}
        raise HTTPException(409, f"could not allocate a version for {body.name!r}; try again")

    async def wait_projected(self, workspace: str, deployment_id: str) -> None:
        import asyncio
        for _ in range(200):
            if await self.pool.fetchval("SELECT 1 FROM gateway.deployments WHERE workspace=$1 AND deployment_id=$2",
                                        workspace, deployment_id):
                return
            await asyncio.sleep(0.025)

    async def end_deployment(self, workspace: str, name: str, delete: bool) -> dict[str, Any]:
        rows = await self.pool.fetch("SELECT deployment_id FROM gateway.deployments WHERE workspace=$1 AND name=$2 "
                                     "AND status <> 'deleted'", workspace, name)
        if not rows:
            raise HTTPException(404, f"no deployment {name!r} in workspace {workspace!r}: see `levers9 deployments list`")
        ids = [r["deployment_id"] for r in rows]
        for dep_id in ids:
            await self.publish(E.DeploymentDeleted(deployment_id=dep_id) if delete
                               else E.DeploymentStopped(deployment_id=dep_id, reason="stopped by user"), workspace)
        live = await self.pool.fetch("SELECT container_id, correlation_id FROM gateway.containers WHERE workspace=$1 "
                                     "AND deployment_id = ANY($2) AND status NOT IN ('stopped','failed')", workspace, ids)
        for c in live:
            await self.publish(E.ContainerStopRequested(container_id=c["container_id"], reason="deployment stopped"),
                               workspace, c["correlation_id"])
        return {"name": name, "deployments": ids, "containers_stopped": len(live), "deleted": delete}

    async def resolve(self, workspace: str, name: str, rest: str) -> tuple[dict, str]:
        head, _, tail = rest.partition("/")
        match = VERSION_RE.fullmatch(head)
        which = head if match else "latest"
        if match or head == "latest":
            rest = tail
        key = (workspace, name, which)
        row = self.deployments.get(key)  # cleared whenever a deployment event is projected
        if row is None:
            if match:
                row = await self.pool.fetchrow("SELECT * FROM gateway.deployments WHERE workspace=$1 AND name=$2 "
                                               "AND version=$3", workspace, name, int(match.group(1)))
            else:
                row = await self.pool.fetchrow("SELECT * FROM gateway.deployments WHERE workspace=$1 AND name=$2 "
                                               "AND status='active' ORDER BY version DESC LIMIT 1", workspace, name)
            if row is None:
                raise HTTPException(404, f"no endpoint {name!r}{' ' + head if match else ''} in workspace "
                                         f"{workspace!r}: deploy it with `levers9 deploy FILE`")
            row = {**dict(row), "spec": json.loads(row["spec"])}
            self.deployments[key] = row
        if row["status"] != "active":
            raise HTTPException(410, f"endpoint {name!r} version {row['version']} is {row['status']}")
        return row, rest

    async def invoke(self, request: Request, caller: Caller, name: str, rest: str):
        dep, subpath = await self.resolve(caller.workspace, name, rest)
        spec = dep["spec"]
        length = int(request.headers.get("content-length") or 0)
        if length > self.settings.max_body_bytes:
            raise HTTPException(413, f"the body is {length} bytes; the limit is {self.settings.max_body_bytes}")
        router = await self.router_for(dep)
        correlation = uuid7()
        timeout = float(spec.get("timeout_seconds", 180))

        async def request_container() -> str:
            checkpoint, accelerator, note = await self.checkpoint_for(dep, spec)
            event = E.ContainerRequested(
                container_id=uuid7(), deployment_id=dep["deployment_id"], cpu_millicores=spec["cpu_millicores"],
                memory_mib=spec["memory_mib"], gpu=spec.get("gpu", []), gpu_count=spec.get("gpu_count", 0),
                pool=spec.get("pool", "default"), reason="call waiting", deployment_version=dep["version"],
                checkpoint_id=checkpoint, accelerator=accelerator, note=note)
            self.container_deployment[event.container_id] = dep["deployment_id"]
            await self.publish(event, caller.workspace, correlation)
            return event.container_id

        try:
            slot = await router.acquire(timeout, request_container)
        except NoCapacity as exc:
            return JSONResponse({"detail": f"no capacity: {exc}", "correlation_id": correlation}, status_code=503,
                                headers={"Retry-After": "5"})
        except StartFailed as exc:
            return JSONResponse({"detail": f"the container for {name!r} failed to start: {exc}",
                                 "correlation_id": correlation}, status_code=502)
        try:
            return await self.proxy(request, slot.address, subpath, timeout, router, slot)
        except BaseException:
            await router.release(slot)
            raise

    async def checkpoint_for(self, dep: dict, spec: dict) -> tuple[str, str, str]:
        """The checkpoint a new container of this deployment should restore, and its accelerator;
        or why it starts cold. Preconditions are checked here, not assumed."""
        if not spec.get("checkpoint_enabled"):
            return "", "", "cold: checkpoint_enabled is off"
        if int(spec.get("gpu_count", 0)) > 1:
            return "", "", f"cold: {spec['gpu_count']} GPUs (a checkpoint holds at most one)"
        row = await self.pool.fetchrow(
            "SELECT checkpoint_id, accelerator FROM gateway.checkpoints WHERE workspace=$1 AND deployment_id=$2 "
            "AND status='available' ORDER BY created_at DESC, checkpoint_id DESC LIMIT 1",
            dep["workspace"], dep["deployment_id"])
        if row is None:
            return "", "", "cold: no checkpoint of this version yet (this start takes one)"
        return row["checkpoint_id"], row["accelerator"], ""

    async def proxy(self, request: Request, address: str, subpath: str, timeout: float, router, slot):
        """One hop to the container. Small bodies are read whole (no chunked re-encoding); large or
        unsized ones stream both ways. The slot is released when the answer has been sent."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        limit = self.settings.max_body_bytes
        length = int(request.headers.get("content-length") or 0)
        if length or "transfer-encoding" not in request.headers:
            body = await request.body() if length else None
        else:
            async def stream():
                seen = 0
                async for chunk in request.stream():
                    seen += len(chunk)
                    if seen > limit:
                        raise HTTPException(413, f"the body is over the limit of {limit} bytes")
                    yield chunk
            body = stream()
        query = request.url.query
        url = yarl.URL(f"{address}/{subpath}" + (f"?{query}" if query else ""), encoded=True)
        try:
            resp = await self.session.request(request.method, url, headers=headers, data=body,
                                              timeout=aiohttp.ClientTimeout(total=timeout))
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            await router.release(slot)
            return JSONResponse({"detail": f"the container did not answer: {type(exc).__name__}: {exc}"},
                                status_code=502)
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
        out_headers["x-levers9-container-id"] = slot.container_id  # which container answered
        if resp.content_length is not None and resp.content_length <= 1 << 20:
            try:
                data = await resp.read()
            finally:
                resp.release()
                await router.release(slot)
            return Response(data, status_code=resp.status, headers=out_headers)

        async def done():
            resp.release()
            await router.release(slot)

        return StreamingResponse(resp.content.iter_chunked(65536), status_code=resp.status, headers=out_headers,
                                 background=_task(done))


def _task(fn):
    from starlette.background import BackgroundTask
    return BackgroundTask(fn)


def _closer(resp: httpx.Response):
    return _task(resp.aclose)


def check_archive(data: bytes, module: str) -> None:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            names = {m.name.lstrip("./") for m in tar.getmembers()}
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise HTTPException(422, f"the code archive is not a tar.gz: {exc}") from None
    if f"{module}.py" not in names:
        raise HTTPException(422, f"the code archive has no {module}.py (it has: {', '.join(sorted(names)[:10])})")
