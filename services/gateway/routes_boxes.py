"""Boxes: /box/{name}/{path} on any method, proxied to a container running the box's program.

A box (code.kind "box") is found by name like an endpoint, always its newest active version (the
whole path below /box/NAME/ is the program's: no version prefix is read from it), and reached the
way an endpoint is (routes_invoke.metered: a slot on a ready container, or a wait while one is
requested, placed, started or restored). The sub-path goes to the program as the caller wrote it
(percent-encoding kept), with the query; the caller's token never does (proxy.HOP_BY_HOP).
"""

from __future__ import annotations

import time
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

from .auth import User
from .deps import Gateway
from .routes_invoke import METHODS, metered
from .state import Deployment
from .state import Gateway as GatewayState

router = APIRouter()


def sub_path(raw_path: str, name: str, decoded: str) -> str:
    """The part of the request's path below /box/NAME/, as the caller sent it (still percent-encoded);
    `decoded` (the route's own parameter, decoded) quoted again when the raw path does not start with
    the plain prefix (a name written percent-encoded)."""
    prefix = f"/box/{name}"
    if raw_path == prefix:
        return ""
    if raw_path.startswith(prefix + "/"):
        return raw_path[len(prefix) + 1:]
    return quote(decoded, safe="/:@!$&'()*+,;=-._~")


def not_found(name: str, workspace: str) -> HTTPException:
    return HTTPException(404, f"no box {name!r} in workspace {workspace!r}: declare it with app.box({name!r}, "
                              "command=[...], port=...) and deploy it with `levers9 deploy FILE`")


async def resolve_box(gw: GatewayState, workspace: str, name: str) -> Deployment:
    """The newest active version of box `name` of this workspace; 404 with a sentence when there is
    none (another workspace's box is none)."""
    key = (workspace, name, "box")
    dep = gw.deployments.get(key)  # cleared whenever a deployment event is projected
    if dep is None:
        row = await gw.pool.fetchrow("SELECT * FROM gateway.deployments WHERE workspace=$1 AND name=$2 "
                                     "AND status='active' ORDER BY version DESC LIMIT 1", workspace, name)
        if row is None:
            raise not_found(name, workspace)
        dep = gw.deployments[key] = Deployment.from_row(row)
    if dep.spec.code.kind != "box":
        what, where = ("a function", f"/function/{dep.spec.app_name}/{name}") if dep.spec.code.kind == "function" \
            else ("an endpoint", f"/endpoint/{name}")
        raise HTTPException(404, f"{name!r} is {what}, not a box: call it at {where}")
    return dep


async def call_box(gw: GatewayState, request: Request, caller: User, name: str, rest: str) -> Response:
    began = time.monotonic()
    dep = await resolve_box(gw, caller.workspace, name)
    raw = request.scope.get("raw_path") or request.url.path.encode()
    return await metered(gw, request, caller, dep, sub_path(raw.decode("latin-1"), name, rest), name, began)


@router.api_route("/box/{name}", methods=METHODS)
async def box_root(name: str, request: Request, caller: User, gw: Gateway) -> Response:
    return await call_box(gw, request, caller, name, "")


@router.api_route("/box/{name}/{rest:path}", methods=METHODS)
async def box_path(name: str, rest: str, request: Request, caller: User, gw: Gateway) -> Response:
    return await call_box(gw, request, caller, name, rest)
