"""What a worker says at start about the containers a previous run of it left behind.

A worker killed without stopping (SIGKILL, a crash, a reboot of the node) leaves containers that
the log still places on it. Its next start removes what is left of them on the node
(`runtime.cleanup_all`); this module then says they failed, before the worker registers. So the
scheduler frees their slots and their deployments get new containers at once, instead of when the
dead run's heartbeat expires (and then, re-requested away from this worker, possibly nowhere).

A placement of one of them still in this worker's consumer (delivered again because the dead run
never acknowledged it) is older than the ContainerFailed said here: it is marked overtaken, and
the worker skips it rather than starting a container the log says failed.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

import nats.js.errors

from levers9.contracts import envelope, subjects
from levers9.contracts import events as E

from .placement import Overtaken

log = logging.getLogger("levers9.worker")

# the statuses of a container a run of this worker had begun to start (or had started)
BEGUN = ("starting", "ready", "stopping")
# 'scheduled' is one of them only when the dead run had acknowledged the placement: a run
# acknowledges it as soon as the start is under way, so it may have died before ContainerStarted;
# a placement it had not acknowledged is delivered again to this run, which starts it
ON_A_WORKER = ("scheduled", *BEGUN)
REASON = ("its worker {worker} ended without stopping it (killed or crashed); the worker's next start "
          "removed what was left of it")
PROJECTION_WAIT_S = 30.0
PLACEMENTS = "worker-{}"  # the worker's durable consumer of its placements (WorkerService.reactions)


def gone(rows: Iterable[Mapping[str, Any]], running: Iterable[str], acked: int) -> list[tuple[str, str, str]]:
    """(workspace, container id, correlation id) of each container the projection places on this
    worker that no run will start or run any more (pure). `rows` are this worker's containers (with
    their status and the stream sequence of their last event), `running` what this run runs, and
    `acked` the sequence up to which this worker's placements consumer acknowledged everything."""
    live = set(running)
    return sorted((r["workspace"], r["container_id"], r["correlation_id"] or "") for r in rows
                  if r["container_id"] not in live
                  and (r["status"] in BEGUN or (r["status"] == "scheduled" and r["last_seq"] <= acked)))


async def acked_up_to(bus: Any, durable: str) -> int:
    """The consumer's acknowledgement floor: every message up to it was acknowledged (0: none)."""
    try:
        info = await bus.js.consumer_info(subjects.STREAM, durable)
    except nats.js.errors.NotFoundError:
        return 0
    return int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0


async def report_gone(service: Any, removed: list[str], overtaken: Overtaken) -> int:
    """Append ContainerFailed for each container a previous run left; how many. `service` is the
    worker's Service (its bus, pool, schema, projection positions, worker id and running
    containers); `removed` is what cleanup_all removed of them on the node."""
    if removed:
        log.warning("removed %d containers left by a previous run: %s", len(removed), removed)
    wanted = await service.bus.last_seq(subjects.filter_subject(aggregate="container"))
    if not await service.wait_projected(wanted, "containers", timeout=PROJECTION_WAIT_S):
        log.warning("containers projection did not reach sequence %d in %.0f s; reporting what it holds",
                    wanted, PROJECTION_WAIT_S)
    rows = await service.pool.fetch(
        f"SELECT workspace, container_id, status, correlation_id, last_seq FROM {service.schema}.containers "
        "WHERE worker_id = $1 AND status = ANY($2::text[])", service.worker_id, list(ON_A_WORKER))
    found = gone(rows, service.containers, await acked_up_to(service.bus, PLACEMENTS.format(service.worker_id)))
    for workspace, container_id, correlation_id in found:
        failed = E.ContainerFailed(container_id=container_id, worker_id=service.worker_id,
                                   reason=REASON.format(worker=service.worker_id))
        ack = await service.bus.publish(envelope(failed, workspace=workspace, correlation_id=correlation_id or None))
        overtaken.saw(container_id, ack.seq, "a previous run of this worker left it and it was reported failed")
    if found:
        log.warning("reported %d containers a previous run of this worker left as failed: %s",
                    len(found), [cid for _, cid, _ in found])
    return len(found)
