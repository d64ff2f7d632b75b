"""What every call of one stream shares (pure but for the router lookup): the executor's header,
the router and how it asks for a sandbox, retries and the per-attempt timeout."""

from __future__ import annotations

from typing import Awaitable, Callable

import msgspec

from levers9.contracts import uuid7
from levers9.contracts.checkpoint_policy import restore_choice
from levers9.contracts.proto import functions_pb2 as pb

from .auth import Caller
from .function_calls import Plan
from .function_targets import Sessions
from .routes_invoke import available_checkpoints, container_requested
from .state import Deployment, route_key
from .state import Gateway as GatewayState


def executor_header(dep: Deployment, ref: pb.FunctionRef, session_id: str) -> dict:
    """The executor's call header (levers9.executor.wire), less the call id."""
    options = dep.spec.function
    function = {"pickled": len(ref.pickled)} if ref.pickled else \
        {"module": dep.spec.code.module, "qualname": dep.spec.code.handler}
    packages = list(ref.packages) if ref.pickled else list(options.packages if options else [])
    return {"kind": "call", "function": function, "session": session_id,
            "generator": bool(ref.generator or (options and options.generator)), "packages": packages,
            "timeout": float(dep.spec.timeout_seconds)}


def requester(gw: GatewayState, dep: Deployment, correlation: str,
              imports: list[str]) -> Callable[[], Awaitable[str]]:
    async def request_container() -> str:
        refs = await available_checkpoints(gw, dep) if dep.spec.checkpoint_enabled else ()
        event = container_requested(dep, restore_choice(dep.spec, refs), uuid7())
        event = msgspec.structs.replace(event, reason="function call", imports=imports)
        gw.container_deployment[event.container_id] = route_key(dep.workspace, dep.deployment_id)
        await gw.publish(event, dep.workspace, correlation)
        return event.container_id
    return request_container


async def plan_for(gw: GatewayState, sessions: Sessions, who: Caller, dep: Deployment, ref: pb.FunctionRef,
                   session_id: str, mode: str, correlation: str) -> Plan:
    options = dep.spec.function
    retries = ref.retries if ref.pickled else (options.retries if options else 0)
    imports = sorted(set(ref.imports))[:200]
    if session_id:
        router = sessions.router(session_id, who.workspace, dep)
        request = sessions.request_container(session_id, dep, correlation, imports)
    else:
        router = await gw.router_for(dep)
        request = requester(gw, dep, correlation, imports)
    app = dep.spec.app_name or ref.app
    return Plan(dep=dep, function=f"{app}.{ref.name or dep.spec.code.handler}" if app else ref.name or dep.name,
                router=router, request_container=request, header=executor_header(dep, ref, session_id),
                function_bytes=bytes(ref.pickled), retries=min(retries, 10), timeout=float(dep.spec.timeout_seconds),
                workspace=who.workspace, token_id=who.token_id, correlation_id=correlation, mode=mode,
                session_id=session_id)
