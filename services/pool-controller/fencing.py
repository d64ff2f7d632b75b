"""Fencing lost workers: what a lost worker left on its node is stopped before its containers are
placed again, so that a container id never runs on two workers at once.

A worker is fenceable here when its state dir is on this machine (`<home>/workers/<id>`: a local or
netns pool's worker, or `levers9 up`'s own): its WorkerLost then says `awaits_fence`, and this
module runs the worker's reaper (`python -m levers9.worker.lifecycle.restart reap ID`, a process of its own:
no service imports another) which kills the run if it is still alive (declared lost while it ran),
then removes its containers (a paused one too), mounts, veths, namespaces and address claims.
WorkerFenced follows, with the ids removed; the scheduler places the containers again only then.

A worker elsewhere (a Kubernetes pod, an attached cluster's pod) is not reachable from here: its
WorkerLost does not await a fence and its containers are placed again at once, as before (its pod
is deleted by stop_worker, which ends the containers running in the pod with it).

Which lost workers still await their fence is read from the log at start (the last WorkerLost and
WorkerFenced of each lost worker), so a controller restarted in between fences them all the same.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import nats.js.errors

from levers9.contracts import SYSTEM_WORKSPACE, ContractError, decode, envelope, subjects
from levers9.contracts import events as E

log = logging.getLogger("levers9.pool_controller")

REAP_TIMEOUT_S = 180.0


class FenceFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class LostRun:
    """What is known of the run declared lost: when it beat last (the controller's clock), and its
    pid and start time (from its beats). The reaper kills only that run, never a newer one."""
    alive_at: float | None = None
    run: tuple[int, float] | None = None

    def args(self) -> list[str]:
        out = ["--alive-at", repr(self.alive_at)] if self.alive_at is not None else []
        if self.run is not None:
            out += ["--lost-run", f"{self.run[0]}@{self.run[1]!r}"]
        return out


Where = Callable[[str], tuple[list[str], dict[str, str]]]  # worker -> (command prefix, settings) of its reaper


class Fencer:
    def __init__(self, home: Path, where: Where = lambda worker_id: ([], {})) -> None:
        self.home = home
        self.where = where  # a netns host's worker is reaped in its host's namespace (backends_netns)
        # lost workers whose fence is still to be done -> what is known of the lost run
        self.pending: dict[str, LostRun] = {}

    def can_fence(self, worker_id: str) -> bool:
        return (self.home / "workers" / worker_id).is_dir()

    async def reap(self, worker_id: str, lost: LostRun = LostRun()) -> list[str]:
        """Run the worker's reaper; the ids of the containers it removed. A run of the worker other
        than the lost one (`levers9 up` restarted it meanwhile) is a newer one: the reaper spares it."""
        prefix, settings = self.where(worker_id)
        env = {**os.environ, **settings, "LEVERS9_HOME": str(self.home), "LEVERS9_WORKER_ID": worker_id}
        proc = await asyncio.create_subprocess_exec(
            *prefix, sys.executable, "-m", "levers9.worker.lifecycle.restart", "reap", worker_id, *lost.args(), env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), REAP_TIMEOUT_S)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise FenceFailed(f"the reaper of worker {worker_id} did not finish within {REAP_TIMEOUT_S:.0f} s") from None
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise FenceFailed(f"the reaper of worker {worker_id} failed ({proc.returncode}): {' | '.join(tail)}")
        lines = out.decode(errors="replace").strip().splitlines()
        return list(json.loads(lines[-1]).get("removed", [])) if lines else []

    async def fence_pending(self, bus: Any) -> None:
        """Fence every pending worker; one that fails stays pending (the next pass tries again)."""
        for worker_id, lost in sorted(self.pending.items()):
            try:
                removed = await self.reap(worker_id, lost)
            except (FenceFailed, OSError, ValueError) as exc:
                log.warning("fencing worker %s failed; trying again next pass: %s", worker_id, exc)
                continue
            await bus.publish(envelope(E.WorkerFenced(worker_id=worker_id, containers=removed, by="pool-controller"),
                                       workspace=SYSTEM_WORKSPACE))
            self.pending.pop(worker_id, None)
            log.warning("worker %s fenced: removed %d containers it left: %s", worker_id, len(removed), removed)

    async def recover(self, bus: Any, lost: list[str]) -> None:
        """At start: the lost workers whose WorkerLost awaits a fence no WorkerFenced answered yet."""
        for worker_id in lost:
            lost_seq, ev = await last_event(bus, worker_id, "WorkerLost")
            fenced_seq, _ = await last_event(bus, worker_id, "WorkerFenced")
            if isinstance(ev, E.WorkerLost) and ev.awaits_fence and fenced_seq < lost_seq:
                self.pending.setdefault(worker_id, LostRun())  # which run was lost is not known here


async def last_event(bus: Any, worker_id: str, event_type: str) -> tuple[int, E.Event | None]:
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
