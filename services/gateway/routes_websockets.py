"""The WebSocket routes: `/endpoint/NAME[/...]` (an `@app.asgi` app or an `@app.realtime` handler)
and `/box/NAME/...`, resolved exactly as their HTTP routes resolve them (routes_invoke.resolve,
routes_boxes.resolve_box: another workspace's is 404), then relayed by ws_proxy.serve. Starlette
matches these only for a WebSocket scope, so the HTTP routes on the same paths are untouched.
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from . import ws_proxy
from .auth import User
from .deps import Gateway
from .routes_boxes import resolve_box, sub_path
from .routes_invoke import resolve

router = APIRouter()


@router.websocket("/endpoint/{name}")
async def endpoint_root(websocket: WebSocket, name: str, caller: User, gw: Gateway) -> None:
    dep, subpath = await resolve(gw, caller.workspace, name, "")
    await ws_proxy.serve(gw, websocket, caller, dep, subpath, name)


@router.websocket("/endpoint/{name}/{rest:path}")
async def endpoint_path(websocket: WebSocket, name: str, rest: str, caller: User, gw: Gateway) -> None:
    dep, subpath = await resolve(gw, caller.workspace, name, rest)
    await ws_proxy.serve(gw, websocket, caller, dep, subpath, name)


async def box(websocket: WebSocket, name: str, rest: str, caller: User, gw: Gateway) -> None:
    dep = await resolve_box(gw, caller.workspace, name)
    raw = websocket.scope.get("raw_path") or websocket.url.path.encode()
    await ws_proxy.serve(gw, websocket, caller, dep, sub_path(raw.decode("latin-1"), name, rest), name)


@router.websocket("/box/{name}")
async def box_root(websocket: WebSocket, name: str, caller: User, gw: Gateway) -> None:
    await box(websocket, name, "", caller, gw)


@router.websocket("/box/{name}/{rest:path}")
async def box_path(websocket: WebSocket, name: str, rest: str, caller: User, gw: Gateway) -> None:
    await box(websocket, name, rest, caller, gw)
