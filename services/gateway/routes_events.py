"""The event API: a workspace's history (`GET /api/v1/events`, from the gateway's index) and its live
events (`GET /api/v1/events/stream`, Server-Sent Events straight from JetStream, resumable by sequence).

Both show the caller's workspace's events and the workers' (event_rules says exactly which); never
another workspace's. The list pages backwards by sequence: `X-Next-Before` is the `before` of the
next (older) page, absent on the last one.
"""

from __future__ import annotations

from typing import AsyncIterator

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .auth import User
from .deps import Gateway
from .event_rules import BadQuery, audiences, list_sql, parse_query, resume_point, row_event, sse
from .event_stream import Follower, clusters_of

router = APIRouter()

MAX_STREAMS = 1000  # per gateway process: each holds a JetStream consumer and a connection
RETRY_MS = 2000  # what an EventSource waits before it reconnects (with Last-Event-ID)
_open = {"streams": 0}


@router.get("/api/v1/events")
async def list_events(request: Request, caller: User, gw: Gateway) -> JSONResponse:
    """Newest first. Query: type (comma list), aggregate, aggregate_id, correlation_id, since, until
    (ISO 8601), before (a seq: older than it), limit (1..1000, default 100)."""
    try:
        q = parse_query(dict(request.query_params))
    except BadQuery as exc:
        raise HTTPException(422, str(exc)) from None
    sql, args = list_sql(q)
    rows = await gw.pool.fetch(sql, audiences(caller.workspace, await clusters_of(gw, caller.workspace)), *args)
    events = [row_event(r) for r in rows[:q.limit]]
    headers = {"X-Next-Before": str(events[-1]["seq"])} if len(rows) > q.limit else {}
    return JSONResponse(events, headers=headers)


@router.get("/api/v1/events/stream")
async def stream_events(request: Request, caller: User, gw: Gateway) -> StreamingResponse:
    """Server-Sent Events: `id: <seq>`, `event: <type>`, `data: <event JSON>`; `: keepalive` after 15 s
    of quiet. Header Last-Event-ID or query `after` (a seq) starts right after it; neither: new events only."""
    try:
        after = resume_point(request.headers.get("last-event-id", ""), request.query_params.get("after", ""))
    except BadQuery as exc:
        raise HTTPException(422, str(exc)) from None
    if _open["streams"] >= MAX_STREAMS:
        raise HTTPException(503, f"this gateway already serves {MAX_STREAMS} event streams; retry in a while",
                            headers={"Retry-After": "5"})
    follower = Follower(gw, caller.workspace, after)
    return StreamingResponse(_frames(follower), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _frames(follower: Follower) -> AsyncIterator[str]:
    """The stream's text. Starlette cancels this when the client goes away: the consumer is deleted
    in Follower.events' finally."""
    _open["streams"] += 1
    try:
        yield f"retry: {RETRY_MS}\n: connected\n\n"  # headers and a first byte at once: the client knows it is on
        async for event in follower.events():
            yield ": keepalive\n\n" if event is None else sse(event)
    finally:
        _open["streams"] -= 1
