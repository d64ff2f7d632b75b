"""How a route reaches the gateway's state: `gw: Gateway` in its signature."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from .state import Gateway as GatewayState


def gateway(conn: HTTPConnection) -> GatewayState:  # a request or a WebSocket
    return conn.app.state.gateway


Gateway = Annotated[GatewayState, Depends(gateway)]
