"""`GET /events`: the workspace's events, live, as Server-Sent Events (fanout.py does the work).

A browser's session cookie or a program's bearer token; `Last-Event-ID` (or `?after=`) resumes
right after that sequence.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .auth import NOT_SIGNED_IN, caller
from .fanout import Hubs, client_frames, own_frames

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def last_id(request: Request) -> int | None:
    value = request.headers.get("last-event-id") or request.query_params.get("after") or ""
    try:
        seq = int(value)
    except ValueError:
        return None
    return seq if seq >= 0 else None


@router.get("/events")
async def events(request: Request) -> Response:
    who = await caller(request)
    if who is None:
        return JSONResponse({"detail": NOT_SIGNED_IN}, status_code=401)
    hubs: Hubs = request.app.state.hubs
    hub = hubs.hub(who.workspace)
    client = await hub.subscribe(who.token, last_id(request))
    if client.own_after is not None:
        body = own_frames(hubs.upstream, who.token, client.own_after, request.app.state.keepalive_s)
    else:
        body = client_frames(hub, client, request.app.state.keepalive_s)
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)
