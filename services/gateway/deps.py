"""How a route reaches the gateway's state: `gw: Gateway` in its signature."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from .state import Gateway as GatewayState


def gateway(request: Request) -> GatewayState:
    return request.app.state.gateway


Gateway = Annotated[GatewayState, Depends(gateway)]
