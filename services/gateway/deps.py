"""How a route reaches the gateway's state: `gw: Gateway` in its signature."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from .state import Gateway as GatewayState


async def gateway(conn: HTTPConnection) -> GatewayState:  # a request or a WebSocket
    """`async` although it awaits nothing: FastAPI runs a plain `def` dependency in a worker thread, a
    thread hop on every request (run_in_threadpool: ~10 % of the gateway's thread under warm calls)."""
    return conn.app.state.gateway


Gateway = Annotated[GatewayState, Depends(gateway)]
