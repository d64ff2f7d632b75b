"""Task queues over REST: put a task, read one, list them, cancel one; and the schedules.

`POST /taskqueue/NAME` appends a TaskEnqueued for the deployed function NAME (one declared with
`@app.task_queue`) and answers 202 with the task id at once; the gateway's task runner
(task_runner.py) runs it. Its arguments are the body, as for `POST /function/APP/NAME`, held to
TASK_PAYLOAD_LIMIT (413) so that the TaskEnqueued fits one message of the log. A task of another
workspace, like an unknown queue, answers 404. `POST /taskqueue/NAME/batch` puts up to 1,000 tasks
in one request (task_batch.py), each item held to what a single put takes.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from msgspec import structs

from levers9.contracts import envelope, subjects, uuid7
from levers9.contracts import events as E
from levers9.contracts.schedule_ticks import next_ticks
from levers9.contracts.spec import spec_from_builtins
from levers9.runtime.bus import ConcurrencyConflict

from . import task_log
from .auth import User
from .body_rules import TASK_PAYLOAD_LIMIT
from .callers import Caller
from .deps import Gateway
from .event_rules import BadQuery, parse_int
from .function_targets import TargetError, deployed
from .routes_functions import arguments
from .state import Deployment, row_json
from .state import Gateway as GatewayState
from .task_batch import BatchRefused, payloads, publish_all
from .views_tasks import TASK_STATES

router = APIRouter()

COLUMNS = "task_id, deployment_id, queue, function, status, attempt, reason, schedule_id, tick, enqueued_at, updated_at"


@router.post("/taskqueue/{name}", status_code=202)
async def put_task(name: str, request: Request, caller: User, gw: Gateway) -> dict[str, Any]:
    body = await request.body()
    if len(body) > TASK_PAYLOAD_LIMIT:
        raise HTTPException(413, f"the task's arguments are {len(body)} bytes; the limit is {TASK_PAYLOAD_LIMIT}")
    dep = await task_queue(gw, caller, name)
    task_id = uuid7()
    await gw.bus.publish(envelope(enqueued(dep, caller, task_id, arguments(body).decode()), workspace=caller.workspace,
                                  id=task_id))
    return {"task_id": task_id, "id": task_id, "status": "queued", "queue": dep.name}


@router.post("/taskqueue/{name}/batch", status_code=202)
async def put_tasks(name: str, request: Request, caller: User, gw: Gateway) -> Any:
    """A JSON array of tasks (at most 1,000), each what `POST /taskqueue/NAME` takes; 202 with their
    ids in the array's order. 503 when some could not be appended: its `task_ids` are the ones that
    were (the others are in `unconfirmed`: they may or may not be), so nothing is lost unsaid."""
    body = await request.body()
    if len(body) > gw.settings.gateway.max_body_bytes:
        raise HTTPException(413, f"the body is {len(body)} bytes; the limit is {gw.settings.gateway.max_body_bytes}")
    try:
        args = payloads(body, TASK_PAYLOAD_LIMIT)
    except BatchRefused as exc:
        raise HTTPException(exc.status, exc.detail) from None
    dep = await task_queue(gw, caller, name)
    template = enqueued(dep, caller, "", "")
    by_id = {uuid7(): a for a in args}

    async def publish(task_id: str) -> object:
        event = structs.replace(template, task_id=task_id, payload=by_id[task_id], enqueued_at=time.time())
        return await gw.bus.publish(envelope(event, workspace=caller.workspace, id=task_id))

    done = await publish_all(by_id, publish)
    if done.failed:
        return JSONResponse({"detail": f"{len(done.failed)} of the {len(by_id)} tasks could not be appended to the "
                                       f"log ({done.failed[0][1]}); the {len(done.ids)} in task_ids were: put the "
                                       "others again", "task_ids": done.ids, "unconfirmed": [t for t, _ in done.failed],
                             "queue": dep.name}, status_code=503)
    return {"task_ids": done.ids, "queue": dep.name}


async def task_queue(gw: GatewayState, caller: Caller, name: str) -> Deployment:
    """The active deployment of the task queue NAME in the caller's workspace; 404 if none."""
    dep = gw.deployments.get((caller.workspace, name, "latest"))  # cleared whenever a deployment event is projected
    if dep is None or dep.status != "active":
        try:
            dep = gw.deployments[(caller.workspace, name, "latest")] = await deployed(gw, caller.workspace, "", name)
        except TargetError:
            dep = None
    if dep is None or dep.spec.task_queue is None or dep.spec.code.kind != "function":
        raise HTTPException(404, f"no task queue {name!r} in workspace {caller.workspace!r}: declare one with "
                                 "@app.task_queue() and deploy it with `levers9 deploy FILE`")
    return dep


def enqueued(dep: Deployment, caller: Caller, task_id: str, payload: str) -> E.TaskEnqueued:
    options = dep.spec.task_queue
    assert options is not None
    return E.TaskEnqueued(
        task_id=task_id, deployment_id=dep.deployment_id, queue=dep.name, function=f"{dep.spec.app_name}.{dep.name}",
        payload=payload, enqueued_at=time.time(), ttl_seconds=options.ttl, retries=options.retries,
        retry_backoff=options.retry_backoff, timeout_seconds=float(dep.spec.timeout_seconds),
        callback_url=options.callback_url, token_id=caller.token_id)


@router.get("/api/v1/tasks/{task_id}")
async def show_task(task_id: str, caller: User, gw: Gateway) -> dict[str, Any]:
    loaded = await task_log.load(gw.bus, caller.workspace, task_id)
    if loaded is None:
        raise HTTPException(404, f"no task {task_id!r} in workspace {caller.workspace!r}")
    return task_log.view(loaded)


@router.post("/api/v1/tasks/{task_id}/cancel")
async def cancel_task(task_id: str, caller: User, gw: Gateway) -> dict[str, Any]:
    """Cancel a task that has not ended: the TaskCancelled is its outcome, a running attempt's own
    outcome is then dropped (and the attempt stopped when this gateway runs it). 409 once it ended."""
    for _ in range(5):
        loaded = await task_log.load(gw.bus, caller.workspace, task_id)
        if loaded is None:
            raise HTTPException(404, f"no task {task_id!r} in workspace {caller.workspace!r}")
        if loaded.state.done:
            raise HTTPException(409, f"task {task_id} has already ended: {loaded.state.status}")
        event = E.TaskCancelled(task_id=task_id, deployment_id=loaded.state.deployment_id, token_id=caller.token_id,
                                reason=f"cancelled by token {caller.token_id}")
        try:
            await gw.bus.append(envelope(event, workspace=caller.workspace), loaded.last_seq)
        except ConcurrencyConflict:
            continue
        runner = getattr(gw, "tasks", None)
        stopped = runner.cancel_here(task_id) if runner is not None else False
        return {"task_id": task_id, "status": "cancelled", "stopped_here": stopped}
    raise HTTPException(409, f"task {task_id} keeps changing; try again")


@router.get("/api/v1/tasks")
async def list_tasks(request: Request, caller: User, gw: Gateway) -> JSONResponse:
    """Newest first. Query: status, queue (the deployment's name), limit (1..1000), offset."""
    params = dict(request.query_params)
    where, args = "", []
    try:
        if params.get("status"):
            if params["status"] not in TASK_STATES:
                raise BadQuery(f"unknown status {params['status'][:40]!r}; one of {', '.join(TASK_STATES)}")
            args.append(params["status"])
            where += f" AND status = ${len(args) + 1}"
        if params.get("queue"):
            args.append(params["queue"])
            where += f" AND queue = ${len(args) + 1}"
        limit = parse_int("limit", params["limit"], 1, 1000) if params.get("limit") else 100
        offset = parse_int("offset", params["offset"], 0, 10_000_000) if params.get("offset") else 0
    except BadQuery as exc:
        raise HTTPException(422, str(exc)) from None
    total = await gw.pool.fetchval(f"SELECT count(*) FROM gateway.tasks WHERE workspace = $1{where}",
                                   caller.workspace, *args)
    rows = await gw.pool.fetch(f"SELECT {COLUMNS} FROM gateway.tasks WHERE workspace = $1{where} "
                               f"ORDER BY enqueued_at DESC, task_id DESC LIMIT {limit} OFFSET {offset}",
                               caller.workspace, *args)
    return JSONResponse({"tasks": [row_json(r) for r in rows], "total": total, "limit": limit, "offset": offset})


@router.get("/api/v1/schedules")
async def list_schedules(caller: User, gw: Gateway) -> dict[str, Any]:
    """Each scheduled function of the workspace: its cron, time zone, next runs and its last tick."""
    rows = await gw.pool.fetch("SELECT DISTINCT ON (name) deployment_id, name, spec FROM gateway.deployments WHERE workspace=$1 "
                               "AND status='active' AND jsonb_typeof(spec->'schedule') = 'object' "
                               "ORDER BY name, version DESC", caller.workspace)
    now = dt.datetime.now(dt.timezone.utc)
    out = []
    for r in rows:
        spec = spec_from_builtins(row_json(r, "spec")["spec"])
        if spec.schedule is None:
            continue
        s = spec.schedule
        last = await task_log.last_message(gw.bus, subjects.subject(caller.workspace, "schedule", r["name"],
                                                                    "ScheduleFired"))
        fired = last[1] if last is not None else None
        out.append({"name": r["name"], "deployment_id": r["deployment_id"], "cron": s.cron, "timezone": s.timezone,
                    "catch_up": s.catch_up, "next_runs": [t.isoformat() for t in next_ticks(s.cron, s.timezone, now, 3)],
                    "last_tick": getattr(fired, "tick", ""), "last_task_id": getattr(fired, "task_id", "")})
    return {"schedules": out}
