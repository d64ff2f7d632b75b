"""A FAKE gateway for the dashboard's tests: the routes the dashboard reads and calls, answered from
memory, with two workspaces' tokens, so every test can check that one never sees the other's.

Not the real gateway (that is services/gateway, tested on its own); this one follows the
contract the dashboard codes against: `/api/v1/events` (newest first, filters, `before` paging,
`X-Next-Before`) and `/api/v1/events/stream` (SSE, `after` / `Last-Event-ID`, live), the lists with
`X-Total-Count`, 404 for another workspace's id. `append()` adds an event as the log would; worker
events (workspace `_sys`) are seen by every workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import uuid
from typing import Any, AsyncIterator

import uvicorn
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse

from levers9.runtime.ports import free_port
from levers9.runtime.service import _Server

TOKENS = {"tok-a": ("ws-a", "workspace"), "tok-b": ("ws-b", "workspace"), "tok-admin": ("admin", "workspace"),
          "tok-worker": ("_sys", "worker:local-1")}
SYSTEM = "_sys"


def now_iso(offset_ms: float = 0.0) -> str:
    t = dt.datetime(2026, 12, 5, 12, 0, 0, tzinfo=dt.timezone.utc) + dt.timedelta(milliseconds=offset_ms)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


class FakeGateway:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.containers: dict[str, dict[str, Any]] = {}  # container_id -> row (with workspace)
        self.deployments: list[dict[str, Any]] = []
        self.workers: list[dict[str, Any]] = []
        self.secrets: dict[str, list[dict[str, Any]]] = {}
        self.logs: dict[str, str] = {}
        self.images: dict[str, dict[str, Any]] = {}  # image_id -> build row (with workspace)
        self.tasks: dict[str, dict[str, Any]] = {}  # task_id -> row (with workspace), as GET /api/v1/tasks lists it
        self.schedules: list[dict[str, Any]] = []  # (with workspace)
        self.posts: list[tuple[str, str]] = []  # (workspace, path) of every change asked
        self.stream_opens: list[tuple[str, int | None]] = []  # (workspace, after) of each /events/stream
        self.appended = asyncio.Condition()
        self.keepalive_s = 15.0
        self.app = self._app()

    # ---- the log -----------------------------------------------------------------------------

    async def append(self, workspace: str, type_: str, aggregate: str, aggregate_id: str, data: dict[str, Any] | None = None,
                     correlation_id: str = "", causation_id: str = "", occurred_at: str = "") -> dict[str, Any]:
        ev = {"seq": len(self.events) + 1, "id": str(uuid.uuid4()), "type": type_, "version": 1,
              "occurred_at": occurred_at or now_iso(len(self.events)), "workspace": workspace,
              "aggregate": aggregate, "aggregate_id": aggregate_id, "correlation_id": correlation_id or str(uuid.uuid4()),
              "causation_id": causation_id, "data": data or {}}
        async with self.appended:
            self.events.append(ev)
            self.appended.notify_all()
        return ev

    def add_bulk(self, events: list[dict[str, Any]]) -> None:
        """Many events at once (benchmarks): seq and id given here."""
        for ev in events:
            ev["seq"] = len(self.events) + 1
            ev.setdefault("id", str(uuid.uuid4()))
            self.events.append(ev)

    def visible(self, workspace: str, ev: dict[str, Any]) -> bool:
        return ev["workspace"] == workspace or (ev["workspace"] == SYSTEM and ev["aggregate"] == "worker")

    # ---- the API -----------------------------------------------------------------------------

    def caller(self, request: Request) -> str:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        found = TOKENS.get(token) if scheme.lower() == "bearer" else None
        if found is None:
            raise HTTPException(401, "missing or unknown token")
        if found[1] != "workspace":
            raise HTTPException(403, "a worker token cannot call the user API")
        return found[0]

    def _app(self) -> FastAPI:  # noqa: C901, PLR0915 - one fake, many small routes
        app = FastAPI()
        gw = self

        @app.get("/healthz")
        async def healthz() -> dict[str, Any]:
            return {"service": "gateway", "healthy": True}

        @app.get("/api/v1/whoami")
        async def whoami(request: Request) -> dict[str, Any]:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if token not in TOKENS:
                raise HTTPException(401, "unknown token")
            return {"workspace": TOKENS[token][0], "token_id": "id-" + token, "scope": TOKENS[token][1]}

        @app.get("/api/v1/deployments")
        async def deployments(request: Request) -> list[dict[str, Any]]:
            ws = gw.caller(request)
            return [d for d in gw.deployments if d["workspace"] == ws]

        @app.get("/api/v1/deployments/{name}/stats")
        async def stats(name: str, request: Request, minutes: int = 60) -> dict[str, Any]:
            ws = gw.caller(request)
            if not any(d["name"] == name and d["workspace"] == ws for d in gw.deployments):
                raise HTTPException(404, f"no deployment {name!r}")
            now = dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0)
            calls = [{"minute": (now - dt.timedelta(minutes=minutes - 1 - i)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                      "calls": i, "errors": 0, "p50_ms": 5.0, "p99_ms": 9.0, "queued_peak": 7 if i == minutes - 1 else 0}
                     for i in range(minutes)]
            return {"deployment": name, "minutes": minutes, "since": calls[0]["minute"], "until": calls[-1]["minute"],
                    "calls": calls, "cold_starts": [], "cold_start_summary": {}, "notes": {}}

        @app.post("/api/v1/deployments/{name}/stop")
        async def stop_deployment(name: str, request: Request) -> dict[str, Any]:
            ws = gw.caller(request)
            if not any(d["name"] == name and d["workspace"] == ws for d in gw.deployments):
                raise HTTPException(404, f"no deployment {name!r}")
            gw.posts.append((ws, request.url.path))
            return {"name": name, "stopped": True}

        @app.get("/api/v1/containers")
        async def containers(request: Request, response: Response, all: bool = False, limit: int = Query(1000, le=10000),
                             offset: int = 0) -> list[dict[str, Any]]:
            ws = gw.caller(request)
            rows = [c for c in gw.containers.values() if c["workspace"] == ws and (all or c["status"] not in ("stopped", "failed"))]
            response.headers["X-Total-Count"] = str(len(rows))
            return rows[offset:offset + limit]

        def container(ws: str, cid: str) -> dict[str, Any]:
            row = gw.containers.get(cid)
            if row is None or row["workspace"] != ws:
                raise HTTPException(404, f"no container {cid!r} in workspace {ws!r}")
            return row

        @app.get("/api/v1/containers/{cid}")
        async def one_container(cid: str, request: Request) -> dict[str, Any]:
            return container(gw.caller(request), cid)

        @app.get("/api/v1/containers/{cid}/logs")
        async def logs(cid: str, request: Request) -> PlainTextResponse:
            container(gw.caller(request), cid)
            return PlainTextResponse(gw.logs.get(cid, ""))

        @app.post("/api/v1/containers/{cid}/stop", status_code=202)
        async def stop_container(cid: str, request: Request) -> dict[str, Any]:
            ws = gw.caller(request)
            container(ws, cid)
            gw.posts.append((ws, request.url.path))
            return {"container_id": cid}

        @app.get("/api/v1/workers")
        async def workers(request: Request) -> list[dict[str, Any]]:
            gw.caller(request)
            return gw.workers

        @app.post("/api/v1/workers/{wid}/{action}", status_code=202)
        async def worker_action(wid: str, action: str, request: Request) -> dict[str, Any]:
            ws = gw.caller(request)
            if ws != "admin":
                raise HTTPException(403, "workers are platform objects: use a token of workspace 'admin'")
            gw.posts.append((ws, request.url.path))
            return {"worker_id": wid, "action": action}

        @app.get("/api/v1/secrets")
        async def secrets(request: Request) -> list[dict[str, Any]]:
            return gw.secrets.get(gw.caller(request), [])

        @app.post("/api/v1/calls/{call_id}/cancel", status_code=202)
        async def cancel(call_id: str, request: Request) -> dict[str, Any]:
            ws = gw.caller(request)
            gw.posts.append((ws, request.url.path))
            return {"call_id": call_id}

        @app.get("/api/v1/internal/deployments/{d}/secrets")
        async def internal(d: str) -> dict[str, Any]:
            return {"values": "never through the dashboard"}

        @app.api_route("/endpoint/{name}/{rest:path}", methods=["GET", "POST"])
        async def endpoint(name: str, rest: str, request: Request) -> dict[str, Any]:
            ws = gw.caller(request)
            return {"endpoint": name, "path": rest, "workspace": ws, "body": (await request.body()).decode()}

        @app.post("/function/{app_name}/{name}")
        async def function(app_name: str, name: str, request: Request) -> dict[str, Any]:
            gw.caller(request)
            body = await request.json()
            return {"result": sum(body["args"]), "correlation_id": "c-fn", "attempts": 1, "output": ""}

        @app.get("/api/v1/images/{image_id}")
        async def image(image_id: str, request: Request) -> dict[str, Any]:
            row = gw.images.get(image_id)
            if row is None or row["workspace"] != gw.caller(request):
                raise HTTPException(404, f"no image {image_id!r}")
            return row

        @app.get("/api/v1/tasks")
        async def tasks(request: Request, status: str = "", queue: str = "", limit: int = 100,
                        offset: int = 0) -> dict[str, Any]:
            ws = gw.caller(request)
            rows = [t for t in gw.tasks.values() if t["workspace"] == ws and (not status or t["status"] == status)
                    and (not queue or t["queue"] == queue)]
            return {"tasks": rows[offset:offset + limit], "total": len(rows), "limit": limit, "offset": offset}

        @app.get("/api/v1/tasks/{task_id}")
        async def one_task(task_id: str, request: Request) -> dict[str, Any]:
            row = gw.tasks.get(task_id)
            if row is None or row["workspace"] != gw.caller(request):
                raise HTTPException(404, f"no task {task_id!r}")
            return {**row, "retries": 0, "ttl": 0, "enqueued_at": 1_700_000_000.0}

        @app.post("/api/v1/tasks/{task_id}/cancel")
        async def cancel_task(task_id: str, request: Request) -> dict[str, Any]:
            ws = gw.caller(request)
            row = gw.tasks.get(task_id)
            if row is None or row["workspace"] != ws:
                raise HTTPException(404, f"no task {task_id!r}")
            gw.posts.append((ws, request.url.path))
            return {"task_id": task_id, "status": "cancelled"}

        @app.get("/api/v1/schedules")
        async def schedules(request: Request) -> dict[str, Any]:
            ws = gw.caller(request)
            return {"schedules": [s for s in gw.schedules if s["workspace"] == ws]}

        @app.get("/api/v1/events")
        async def events(request: Request, response: Response, type: str = "", aggregate: str = "",
                         aggregate_id: str = "", correlation_id: str = "", before: int = 0,
                         limit: int = Query(100, ge=1, le=1000)) -> list[dict[str, Any]]:
            ws = gw.caller(request)
            types = set(filter(None, type.split(",")))
            found = []
            for ev in reversed(gw.events):
                if before and ev["seq"] >= before:
                    continue
                if not gw.visible(ws, ev) or (types and ev["type"] not in types):
                    continue
                if (aggregate and ev["aggregate"] != aggregate) or (aggregate_id and ev["aggregate_id"] != aggregate_id):
                    continue
                if correlation_id and ev["correlation_id"] != correlation_id:
                    continue
                found.append(ev)
                if len(found) > limit:
                    break
            if len(found) > limit:
                response.headers["X-Next-Before"] = str(found[limit - 1]["seq"])
            return found[:limit]

        @app.get("/api/v1/events/stream")
        async def stream(request: Request, after: int | None = None) -> StreamingResponse:
            ws = gw.caller(request)
            last = request.headers.get("last-event-id")
            start = int(last) if last else after
            gw.stream_opens.append((ws, start))
            return StreamingResponse(gw.frames(ws, start), media_type="text/event-stream")

        return app

    async def frames(self, ws: str, start: int | None) -> AsyncIterator[bytes]:
        position = len(self.events) if start is None else start  # seq == index + 1
        while True:
            async with self.appended:
                try:
                    await asyncio.wait_for(self.appended.wait_for(lambda: len(self.events) > position), self.keepalive_s)
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
            batch = self.events[position:]
            position += len(batch)
            out = b"".join(f"id: {e['seq']}\nevent: {e['type']}\ndata: {json.dumps(e)}\n\n".encode()
                           for e in batch if self.visible(ws, e))
            if out:
                yield out


@contextlib.asynccontextmanager
async def serving(app: Any, port: int | None = None) -> AsyncIterator[str]:
    """Serve an ASGI app on a ledger port until the block ends; yields its base URL once it listens."""
    port = port or free_port()
    server = _Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="off",
                                    timeout_graceful_shutdown=1))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:  # uvicorn has no awaitable "started"; its flag flips once bound
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        server.force_exit = True
        await task


def json_dumps(doc: Any) -> str:
    return json.dumps(doc)
