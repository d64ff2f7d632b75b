"""Functions over REST: where the gRPC service is, and `POST /function/<app>/<name>` for callers in
other languages (JSON arguments in, a JSON result out; the sandbox does the JSON, the gateway never
unpickles anything)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from levers9.contracts import uuid7
from levers9.contracts.proto import functions_pb2 as pb

from .auth import User
from .deps import Gateway
from .function_plans import plan_for
from .function_targets import TargetError, deployed

router = APIRouter()

HTTP_OF = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 422, "FAILED_PRECONDITION": 409, "UNAVAILABLE": 503,
           "DEADLINE_EXCEEDED": 504}


@router.get("/api/v1/functions/info")
async def info(request: Request, caller: User, gw: Gateway) -> dict[str, Any]:
    if not getattr(gw, "grpc_port", 0):
        raise HTTPException(503, "the gateway's gRPC service is not up yet; try again")
    host = request.url.hostname or gw.settings.process.http_host
    return {"grpc_address": f"{host}:{gw.grpc_port}", "tls": bool(gw.settings.functions.grpc_tls_cert),
            "python": gw.settings.functions.sandbox_python, "protocol": 1}


class Collected:
    def __init__(self) -> None:
        self.out: list[str] = []

    async def output(self, fd: int, text: str) -> None:
        if sum(map(len, self.out)) < 1 << 20:  # the answer carries the first MiB of output
            self.out.append(text)

    async def item(self, value: bytes) -> None:
        return None


def arguments(body: bytes) -> bytes:
    """`{"args": [...], "kwargs": {...}}`, or any other object as keyword arguments, or nothing."""
    if not body.strip():
        return b'{"args": [], "kwargs": {}}'
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise HTTPException(422, f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HTTPException(422, 'send a JSON object: {"args": [...], "kwargs": {...}} or the keyword arguments')
    if set(data) <= {"args", "kwargs"} and data:
        args, kwargs = data.get("args", []), data.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise HTTPException(422, "args must be a JSON array and kwargs an object")
        return json.dumps({"args": args, "kwargs": kwargs}).encode()
    return json.dumps({"args": [], "kwargs": data}).encode()


@router.post("/function/{app}/{name}")
async def call_function(app: str, name: str, request: Request, caller: User, gw: Gateway) -> JSONResponse:
    body = await request.body()
    if len(body) > gw.settings.gateway.max_body_bytes:
        raise HTTPException(413, f"the body is {len(body)} bytes; the limit is {gw.settings.gateway.max_body_bytes}")
    functions = getattr(gw, "functions", None)
    if functions is None:
        raise HTTPException(503, "function calls are not up yet; try again")
    try:
        dep = await deployed(gw, caller.workspace, app, name)
        plan = await plan_for(gw, functions.sessions, caller, dep, pb.FunctionRef(app=app, name=name), "", "rest",
                              uuid7())
    except TargetError as exc:
        raise HTTPException(HTTP_OF.get(exc.code, 400), str(exc)) from None
    plan.header = {**plan.header, "json": True, "generator": False}
    sink = Collected()
    outcome, attempts = await functions.calls.run(plan, uuid7(), arguments(body), sink, asyncio.Event())
    common = {"correlation_id": plan.correlation_id, "attempts": attempts, "output": "".join(sink.out)}
    if outcome.ok:
        return JSONResponse({"result": json.loads(outcome.value or b"null"), **common})
    status = 504 if outcome.kind == "timeout" else 502 if outcome.reason else 500
    return JSONResponse({"detail": outcome.reason or f"{outcome.error_type}: {outcome.error}",
                         "error_type": outcome.error_type, "traceback": outcome.traceback, **common},
                        status_code=status)
