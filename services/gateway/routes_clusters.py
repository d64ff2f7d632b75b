"""Attached clusters: attach, list, share, detach, and the agent's stream.

- POST /api/v1/clusters {"name"}: the caller's workspace attaches cluster NAME (a name is each
  workspace's own: on the platform the cluster is `WORKSPACE/NAME`, its `ref`, which pools name) and gets, once, the join token of its agent: a token of that workspace with scope `cluster:NAME`,
  which may open that cluster's stream and nothing else (the user API refuses it, as any non-workspace
  token). The CLI renders the manifest to apply in the cluster around it (levers9.agent_manifest).
- GET /api/v1/clusters: the clusters the workspace owns or was shared, with whether their agent is
  connected to this gateway.
- POST /api/v1/clusters/{name}/share {"workspace", "owner"}: another workspace's work may run there too.
  Who may: a platform admin only (a workspace token of `default`; any other token gets 403 saying
  so): the owner runs that cluster, and could read the work of a workspace it shared itself into, so
  that workspace's consent is the platform's to give. `owner` names the attaching workspace
  (default: the caller's); no such cluster of that owner is 404.
- DELETE /api/v1/clusters/{name}: detach; its join token is revoked and its agent cut off.
- WS /api/v1/clusters/{name}/agent: the agent's one long-lived stream, opened by the agent (nothing
  connects into the cluster). Refused before the handshake completes: no token 401, an unknown or
  revoked one 401, a token that is not this cluster's current join token 403.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from fastapi import APIRouter, HTTPException, WebSocket, WebSocketDisconnect
from fastapi.responses import Response
from pydantic import BaseModel

from levers9.contracts import events as E
from levers9.contracts.events.cluster import ClusterAttached, ClusterDetached, ClusterShared, cluster_ref
from levers9.contracts.ids import InvalidName, check_workspace
from levers9.runtime.tokens import mint

from .auth import ADMIN_WORKSPACE, Caller, User, admin_refusal, bearer_secret, lookup
from .cluster_relay import SILENT_S, Agent, ClusterRelay
from .deps import Gateway
from .state import row_json

router = APIRouter()
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")  # a DNS label, short enough for pod names
PROJECTED_WITHIN_S = 10.0


class AttachRequest(BaseModel):
    name: str


class ShareRequest(BaseModel):
    workspace: str
    owner: str = ""  # the workspace that attached it; empty: the caller's (the platform's own clusters)


def cluster_scope(name: str) -> str:
    return f"cluster:{name}"


def stream_refusal(caller: Caller | None, name: str, row: Any) -> tuple[int, str]:
    """Whether a caller may open cluster `name`'s agent stream: (0, "") or (status, why). Pure."""
    if caller is None:
        return 401, "unknown or revoked join token"
    if caller.scope != cluster_scope(name):
        return 403, f"this token is not a join token of cluster {name!r}"
    if row is None or row["detached"] or row["workspace"] != caller.workspace or row["token_id"] != caller.token_id:
        return 403, f"cluster {name!r} is not attached with this join token"
    return 0, ""


def share_refusal(caller: Caller, name: str, workspace: str) -> str:
    """Why this caller may not share cluster `name` into `workspace` ("" when it may). Pure.

    Sharing puts another workspace's work (its code, its secrets) on a cluster its owner runs: the
    owner alone may not decide that for the other workspace, so only a platform admin shares."""
    if admin_refusal(caller):
        return (f"sharing cluster {name!r} into workspace {workspace!r} was refused: sharing a cluster puts that "
                f"workspace's work on a cluster another workspace runs, so it needs a platform admin's token "
                f"(workspace {ADMIN_WORKSPACE!r}); ask the platform's admin to run `levers9 clusters share {name} "
                f"--workspace {workspace} --owner {caller.workspace}`")
    return ""


def _name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise HTTPException(400, f"cluster name {name!r} must be 1-40 of a-z, 0-9 and '-', starting and ending "
                                 "with a letter or digit")
    return name


def relay(gw: Any) -> ClusterRelay:
    found = getattr(gw, "cluster_relay", None)
    if found is None:
        found = gw.cluster_relay = ClusterRelay(lambda: gw.bus.nc)
    return found


async def _row(gw: Any, ref: str) -> Any:
    return await gw.pool.fetchrow("SELECT * FROM gateway.clusters WHERE name=$1", ref)


async def _owned(gw: Any, caller: Caller, name: str) -> Any:
    row = await _row(gw, cluster_ref(caller.workspace, _name(name)))
    if row is None or row["workspace"] != caller.workspace or row["detached"]:
        raise HTTPException(404, f"no cluster {name!r} attached by workspace {caller.workspace!r}")
    return row


async def _projected(gw: Any, ref: str, check: Any) -> None:
    deadline = time.monotonic() + PROJECTED_WITHIN_S
    while not check(await _row(gw, ref)) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


@router.post("/api/v1/clusters", status_code=201)
async def attach(body: AttachRequest, caller: User, gw: Gateway) -> dict[str, Any]:
    name = _name(body.name)
    ref = cluster_ref(caller.workspace, name)
    row = await _row(gw, ref)
    if row is not None and not row["detached"]:
        raise HTTPException(409, f"cluster {name!r} is attached already by this workspace: detach it first")
    token = mint(name=f"agent of cluster {name}", scope=cluster_scope(name))
    await gw.publish(token.event, caller.workspace)
    await gw.publish(ClusterAttached(name=name, token_id=token.token_id), caller.workspace)
    await _projected(gw, ref, lambda r: r is not None and r["token_id"] == token.token_id and not r["detached"])
    return {"name": name, "ref": ref, "workspace": caller.workspace, "token": token.secret,
            "token_id": token.token_id}


@router.get("/api/v1/clusters")
async def list_clusters(caller: User, gw: Gateway) -> list[dict[str, Any]]:
    rows = await gw.pool.fetch(
        """SELECT c.name, c.workspace, c.attached_at, coalesce(array_agg(s.workspace ORDER BY s.workspace)
                  FILTER (WHERE s.workspace IS NOT NULL), '{}') AS shared_with
           FROM gateway.clusters c LEFT JOIN gateway.cluster_shares s ON s.name = c.name
           WHERE NOT c.detached AND (c.workspace = $1 OR EXISTS (SELECT 1 FROM gateway.cluster_shares x
                                                               WHERE x.name = c.name AND x.workspace = $1))
           GROUP BY c.name ORDER BY c.name""", caller.workspace)
    out = []
    for r in rows:
        item = row_json(r)
        item["ref"], item["name"] = r["name"], r["name"].split("/", 1)[-1]
        agent = relay(gw).connected(r["name"])
        item["agent"] = "connected" if agent else "not connected"
        item["agent_last_seen"] = round(time.time() - agent.last_seen, 1) if agent else None
        if r["workspace"] != caller.workspace:
            item["shared_with"] = [caller.workspace]  # another workspace's shares are not this one's business
        out.append(item)
    return out


@router.post("/api/v1/clusters/{name}/share")
async def share(name: str, body: ShareRequest, caller: User, gw: Gateway) -> dict[str, Any]:
    try:
        workspace = check_workspace(body.workspace)
        owner = check_workspace(body.owner) if body.owner else caller.workspace
    except InvalidName as e:
        raise HTTPException(400, str(e)) from None
    refusal = share_refusal(caller, _name(name), workspace)
    if refusal:
        raise HTTPException(403, refusal)
    await _owned(gw, Caller(workspace=owner, token_id=caller.token_id), name)
    await gw.publish(ClusterShared(name=name, workspace=workspace), owner)
    ref = cluster_ref(owner, name)
    deadline = time.monotonic() + PROJECTED_WITHIN_S
    while time.monotonic() < deadline and not await gw.pool.fetchval(
            "SELECT 1 FROM gateway.cluster_shares WHERE name=$1 AND workspace=$2", ref, workspace):
        await asyncio.sleep(0.02)
    return {"name": name, "ref": ref, "shared_with": workspace}


@router.delete("/api/v1/clusters/{name}")
async def detach(name: str, caller: User, gw: Gateway) -> dict[str, Any]:
    row = await _owned(gw, caller, name)
    await gw.publish(ClusterDetached(name=name), caller.workspace)
    if row["token_id"]:
        await gw.publish(E.TokenRevoked(token_id=row["token_id"]), caller.workspace)
    ref = cluster_ref(caller.workspace, name)
    await _projected(gw, ref, lambda r: r is None or r["detached"])
    agent = relay(gw).connected(ref)
    if agent is not None:
        await relay(gw).detach(agent)
    return {"name": name, "detached": True}


@router.websocket("/api/v1/clusters/{name}/agent")
async def agent_stream(websocket: WebSocket, name: str) -> None:
    gw = websocket.app.state.gateway
    secret = bearer_secret(websocket.headers.get("authorization", ""))
    caller = await lookup(gw, secret) if secret else None
    row = await _row(gw, cluster_ref(caller.workspace, name)) if caller is not None and NAME.fullmatch(name) else None
    status, why = stream_refusal(caller, name, row)
    if status:
        await websocket.send_denial_response(Response(json.dumps({"detail": why}), status_code=status,
                                                      media_type="application/json"))
        return
    assert caller is not None
    await websocket.accept()
    agent = Agent(cluster_ref(caller.workspace, name), caller.workspace, websocket.send_text, namespace=websocket.query_params.get("namespace", ""),
                  close=lambda: websocket.close(1000, "detached or replaced"))
    await relay(gw).attach(agent)
    try:
        while True:
            message = json.loads(await asyncio.wait_for(websocket.receive_text(), SILENT_S))
            if isinstance(message, dict):
                relay(gw).report(agent, message)
    except (WebSocketDisconnect, ValueError, RuntimeError, asyncio.TimeoutError):
        pass  # gone, garbled, closed by detach, or silent too long: the agent reconnects
    finally:
        await relay(gw).detach(agent)
