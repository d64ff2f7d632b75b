"""Memory at start: read from the scheduler's projection, its durable state, in one snapshot.

Rows and positions are read in one REPEATABLE READ transaction, so the state and the sequence each
consumer resumes after agree even while another replica applies events to the same tables.
Containers that stopped or failed and hold no slot are not read: nothing about them can matter.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any, Mapping

import asyncpg
import msgspec
import nats.js.errors

from levers9.contracts import SYSTEM_WORKSPACE, ContractError, decode, subjects
from levers9.contracts import events as E
from levers9.contracts.spec import CheckpointRef, Resources

from .placement import WorkerState
from .state import Clusters, Container, ContainerKey, Slot, State, Worker, new_worker

log = logging.getLogger("levers9.scheduler")

CONTAINERS = """
    SELECT c.* FROM {schema}.containers c
    WHERE c.status NOT IN ('stopped', 'failed')
       OR EXISTS (SELECT 1 FROM {schema}.worker_slots s
                  WHERE s.workspace = c.workspace AND s.container_id = c.container_id)
    ORDER BY c.requested_at NULLS LAST, c.container_id"""


async def load(pool: asyncpg.Pool, schema: str) -> tuple[State, dict[str, int]]:
    """(state, {projection: position}) as of one snapshot of the projection."""
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        positions = {r["projection"]: int(r["seq"]) for r in await conn.fetch(f"SELECT * FROM {schema}.positions")}
        worker_rows = await conn.fetch(f"SELECT * FROM {schema}.workers")
        slot_rows = await conn.fetch(f"SELECT * FROM {schema}.worker_slots")
        container_rows = await conn.fetch(CONTAINERS.format(schema=schema))
        clusters, on_cluster = await load_clusters(conn, schema)
    workers = {r["worker_id"]: Worker(worker_state(r, on_cluster), {}) for r in worker_rows}
    for r in slot_rows:
        w = workers.get(r["worker_id"]) or new_worker(r["worker_id"])
        slot = Slot(r["container_id"], r["workspace"], r["cpu_millicores"], r["memory_mib"], r["gpu_count"],
                    r["reserved_seq"])
        workers[w.worker_id] = Worker(w.state, {**w.slots, slot.container_id: slot})
    containers: dict[ContainerKey, Container] = {}
    for i, r in enumerate(container_rows):  # older than anything to come: orders below every sequence
        c = container(r, order=i - len(container_rows))
        containers[c.key] = c
    return State(workers, containers, clusters=clusters), positions


async def load_clusters(conn: asyncpg.Connection, schema: str) -> tuple[Clusters, dict[str, str]]:
    """Attached clusters (owner, workspaces admitted) and which cluster each worker runs on."""
    clusters: dict[str, tuple[str, frozenset[str]]] = {}
    for r in await conn.fetch(f"SELECT name, workspace, detached FROM {schema}.clusters"):
        clusters[r["name"]] = (r["workspace"], frozenset() if r["detached"] else frozenset({r["workspace"]}))
    for r in await conn.fetch(f"SELECT name, workspace FROM {schema}.cluster_shares"):
        owner, admitted = clusters.get(r["name"], ("", frozenset()))
        if admitted:
            clusters[r["name"]] = (owner, admitted | {r["workspace"]})
    on_cluster = {r["worker_id"]: r["cluster"] for r in await conn.fetch(f"SELECT * FROM {schema}.cluster_workers")}
    return clusters, on_cluster


async def awaiting_fence(bus: Any, state: State) -> State:
    """The state with `fence_awaited` set on each lost worker whose last WorkerLost awaits a fence
    that no WorkerFenced answered since (the projection keeps neither: the log does). Only lost
    workers that still have containers on them are looked up (two reads of the log each)."""
    on_lost = {c.worker_id for c in state.containers.values()
               if c.worker_id in state.workers and state.workers[c.worker_id].state.status == "lost"}
    workers = dict(state.workers)
    for wid in sorted(on_lost):
        lost_seq, lost = await _last(bus, wid, "WorkerLost")
        fenced_seq, _ = await _last(bus, wid, "WorkerFenced")
        if isinstance(lost, E.WorkerLost) and lost.awaits_fence and fenced_seq < lost_seq:
            w = workers[wid]
            workers[wid] = replace(w, state=replace(w.state, fence_awaited=True))
    return replace(state, workers=workers)


async def _last(bus: Any, worker_id: str, event_type: str) -> tuple[int, E.Event | None]:
    """The sequence and event of a worker's last event of that type (0, None: none)."""
    subject = subjects.filter_subject(workspace=SYSTEM_WORKSPACE, aggregate="worker", aggregate_id=worker_id,
                                      event_type=event_type)
    try:
        msg = await bus.js.get_last_msg(subjects.STREAM, subject)
    except nats.js.errors.NotFoundError:
        return 0, None
    try:
        return int(msg.seq or 0), decode(msg.data).event
    except ContractError:
        return int(msg.seq or 0), None


def worker_state(row: Mapping[str, Any], on_cluster: Mapping[str, str] | None = None) -> WorkerState:
    """A worker as its row says; a cluster's worker the clusters view has not seen yet admits nobody
    ("?") until it has: never anyone's work by default."""
    cluster = (on_cluster or {}).get(row["worker_id"], "") or ("?" if row.get("backend") == "cluster" else "")
    return WorkerState(worker_id=row["worker_id"], pool=row["pool"], status=row["status"],
                       cpu_millicores=row["cpu_millicores"], memory_mib=row["memory_mib"], gpu_type=row["gpu_type"],
                       gpu_count=row["gpu_count"], cpu_used=row["cpu_used"], memory_used=row["memory_used"],
                       gpu_used=row["gpu_used"], features=frozenset(row["features"]), cordoned=row["cordoned"],
                       last_seq=row["last_seq"], cluster=cluster)


def container(row: Mapping[str, Any], order: int) -> Container:
    return Container(row["workspace"], row["container_id"], row["status"], row["last_seq"], order,
                     worker_id=row["worker_id"], reason=row["reason"], correlation_id=row["correlation_id"],
                     request=request_of(row))


def request_of(row: Mapping[str, Any]) -> E.ContainerRequested | None:
    """The ContainerRequested the row was last asked with: its `request` column, or for a row written
    before that column existed, what its other columns kept of it."""
    raw = row["request"]
    if raw is not None:
        data = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
        try:
            return msgspec.convert(data, E.ContainerRequested)
        except msgspec.ValidationError as exc:  # written by an older scheduler: rebuild from the columns
            log.warning("container %s: its request does not decode (%s); using its columns", row["container_id"], exc)
    if row["requested_at"] is None:
        return None  # never requested: nothing to place
    checkpoint = (CheckpointRef(checkpoint_id=row["checkpoint_id"], accelerator=row["accelerator"])
                  if row["checkpoint_id"] else None)
    resources = Resources(cpu_millicores=row["cpu_millicores"], memory_mib=row["memory_mib"], gpu=list(row["gpu"]),
                          gpu_count=row["gpu_count"])
    return E.ContainerRequested(container_id=row["container_id"], deployment_id=row["deployment_id"],
                                deployment_version=row["deployment_version"], resources=resources,
                                pool=row["pool"] or "default", checkpoint=checkpoint, attempt=row["attempt"],
                                excluded_workers=list(row["excluded_workers"]), note=row["note"])
