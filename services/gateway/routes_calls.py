"""Function calls: list them, show one, cancel one (the caller's workspace only).

The list and each call's state come from `gateway.function_calls`, a projection of the
FunctionCallStarted/Finished events the gateway appends (views_events.CallsView): every replica
answers the same. What the log never holds, a failed call's remote traceback, is shown when this
process ran the call and still keeps it (the last TRACEBACKS_KEPT). A cancel reaches a call that
runs in this process; a call another replica runs answers 409 saying so.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from .auth import User
from .deps import Gateway
from .event_rules import BadQuery, parse_int
from .state import Gateway as GatewayState
from .state import row_json
from .views_events import CALL_STATES

router = APIRouter()

COLUMNS = ("call_id, deployment_id, function, token_id, mode, session_id, container_id, attempts, state, error_type, "
           "reason, duration_ms, started_at, finished_at, correlation_id")
FINISHED = ("ok", "error", "timeout", "cancelled", "failed")


def calls_filter(params: dict[str, str]) -> tuple[str, list[Any], int, int]:
    """(WHERE after the workspace's $1, its args, limit, offset) of the list's query string."""
    where, args = "", []
    status = params.get("status", "")
    if status:
        if status not in CALL_STATES:
            raise BadQuery(f"unknown status {status[:40]!r}; one of {', '.join(CALL_STATES)}")
        args.append(status)
        where += f" AND state = ${len(args) + 1}"
    function = params.get("function", "")
    if function:
        args.append(function)
        where += f" AND (function = ${len(args) + 1} OR deployment_id = ${len(args) + 1})"
    limit = parse_int("limit", params["limit"], 1, 1000) if params.get("limit") else 100
    offset = parse_int("offset", params["offset"], 0, 10_000_000) if params.get("offset") else 0
    return where, args, limit, offset


@router.get("/api/v1/calls")
async def list_calls(request: Request, caller: User, gw: Gateway) -> JSONResponse:
    """Newest first. Query: status, function (app.name or its deployment id), limit (1..1000), offset."""
    try:
        where, args, limit, offset = calls_filter(dict(request.query_params))
    except BadQuery as exc:
        raise HTTPException(422, str(exc)) from None
    total = await gw.pool.fetchval(f"SELECT count(*) FROM gateway.function_calls WHERE workspace = $1{where}",
                                   caller.workspace, *args)
    rows = await gw.pool.fetch(f"SELECT {COLUMNS} FROM gateway.function_calls WHERE workspace = $1{where} "
                               f"ORDER BY started_at DESC, call_id DESC LIMIT {limit} OFFSET {offset}",
                               caller.workspace, *args)
    return JSONResponse([row_json(r) for r in rows], headers={"X-Total-Count": str(total)})


async def _call(gw: GatewayState, workspace: str, call_id: str) -> dict[str, Any] | None:
    row = await gw.pool.fetchrow(f"SELECT {COLUMNS} FROM gateway.function_calls WHERE workspace = $1 AND call_id = $2",
                                 workspace, call_id[:200])
    return row_json(row) if row is not None else None


def _calls(gw: GatewayState) -> Any:
    functions = getattr(gw, "functions", None)
    return functions.calls if functions is not None else None


@router.get("/api/v1/calls/{call_id}")
async def get_call(call_id: str, caller: User, gw: Gateway) -> dict[str, Any]:
    """One call: state, attempts, duration_ms (all attempts), error type and reason, and its remote
    traceback when this gateway ran it and still keeps it (else null)."""
    call = await _call(gw, caller.workspace, call_id)
    if call is None:
        raise HTTPException(404, f"no function call {call_id[:80]!r} in this workspace: see GET /api/v1/calls")
    calls = _calls(gw)
    kept = calls.tracebacks.get(call_id) if calls is not None else None
    call["traceback"] = kept[1] if kept is not None and kept[0] == caller.workspace else None
    call["duration_ms"] = round(float(call["duration_ms"]), 3)
    return call


@router.post("/api/v1/calls/{call_id}/cancel", status_code=202)
async def cancel_call(call_id: str, caller: User, gw: Gateway) -> dict[str, Any]:
    calls = _calls(gw)
    running = calls.running.get(call_id) if calls is not None else None
    if running is not None and running.workspace == caller.workspace:
        running.cancel.set()  # the executor is told; its FunctionCallFinished says `cancelled`
        return {"call_id": call_id, "cancelling": True}
    call = await _call(gw, caller.workspace, call_id)
    if call is None:
        raise HTTPException(404, f"no function call {call_id[:80]!r} in this workspace: see GET /api/v1/calls")
    if call["state"] in FINISHED:
        raise HTTPException(409, f"call {call_id} already finished ({call['state']}): nothing to cancel")
    raise HTTPException(409, f"call {call_id} is not running in this gateway process (another replica runs it, "
                             "or it has just ended); cancel it through the client that made it")
