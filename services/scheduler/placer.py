"""The placer: turns the plan of a pass into appends, many at once, in the order the log needs.

- Reservations on one worker are chained: each expects the worker's last sequence, which after our
  previous reservation there is that reservation's own sequence (folded into memory as soon as the
  append is acknowledged). Reservations on different workers go concurrently.
- A container's ContainerScheduled is appended as soon as its slot is reserved, expecting the
  container's last sequence the decision was made on: a container is scheduled once.
- A conflict means someone else appended to that aggregate (another scheduler, the worker itself).
  That worker (or container) is stale until the consumer brings an event newer than the one we
  knew (or for at most STALE_S): no pass decides on it meanwhile, so a conflict never turns into a
  loop of appends that can only conflict again. What was queued behind it goes back to the backlog.
- A ContainerScheduled that loses releases its reservation, naming it (WorkerSlotReleased with the
  reservation's sequence), so the winner's slot is never freed by mistake.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable

import msgspec

from levers9.contracts import SYSTEM_WORKSPACE, Envelope, Message, envelope
from levers9.contracts import events as E
from levers9.contracts.catalogue import Catalogue
from levers9.contracts.envelope import subject_of
from levers9.runtime.bus import Appended, ConcurrencyConflict
from levers9.runtime.tasks import spawn

from .memory import Memory
from .placement import WorkerState, gpus_taken
from .plan import Defer, Hold, Place, Step, plan
from .state import Container, ContainerKey, Slot, access_of, takes_work

log = logging.getLogger("levers9.scheduler")

STALE_S = 1.0  # a stale aggregate is decided on again after this, even if nothing new arrived
PASS_LIMIT = 256  # containers decided per pass; the rest in the next one, after the loop breathed
MAX_QUEUED = 8192  # placements decided but not yet reserved
RELEASE_AGAIN_S = 30.0  # a release not seen back by then is published again (same id: dropped if it landed)
RELEASE_NS = uuid.UUID("5b0c3e52-4f7e-4d7c-9a57-0f3f0c0a9e11")

AppendFn = Callable[[Envelope, int], Awaitable[Appended]]
PublishFn = Callable[[Envelope], Awaitable[Appended]]


def release_id(worker_id: str, container_id: str, reserved_seq: int) -> str:
    """The same release decided twice (two passes, two schedulers) is one event: the server drops
    the repeat by this id."""
    return str(uuid.uuid5(RELEASE_NS, f"{worker_id}:{container_id}:{reserved_seq}"))


@dataclass
class Counters:
    placed: int = 0
    deferred: int = 0
    conflicts: int = 0
    released: int = 0
    requeued: int = 0


@dataclass(frozen=True)
class Queued:
    place: Place
    foreign: int  # memory.foreign of its worker when it was decided: the decision holds while it stays


@dataclass
class WorkerQueue:
    """Placements decided on one worker and not reserved yet, in order, and what they will take."""
    items: deque[Queued] = field(default_factory=deque)
    cpu: int = 0
    memory: int = 0
    gpus: int = 0

    def push(self, item: Queued) -> None:
        self.items.append(item)
        self._count(item, 1)

    def pop(self) -> None:
        self._count(self.items.popleft(), -1)

    def _count(self, item: Queued, sign: int) -> None:
        req = item.place.decision.request
        self.cpu += sign * req.cpu_millicores
        self.memory += sign * req.memory_mib
        self.gpus += sign * gpus_taken(req)

    def view(self, state: WorkerState) -> WorkerState:
        """The worker as the next decision must see it: with what is queued taken already."""
        if not self.items:
            return state
        return replace(state, cpu_used=state.cpu_used + self.cpu, memory_used=state.memory_used + self.memory,
                       gpu_used=state.gpu_used + self.gpus)


@dataclass
class Stale:
    """Aggregates an append to which just conflicted: not decided on until memory has seen an event
    of theirs newer than the one we knew, or for at most STALE_S."""
    clock: Callable[[], float] = time.monotonic
    known: dict[str, tuple[int, float]] = field(default_factory=dict)  # id -> (last seq we knew, since)

    def mark(self, key: str, known_seq: int) -> None:
        self.known[key] = (known_seq, self.clock())

    def clear(self, last_seq_of: Callable[[str], int]) -> bool:
        """Forget what moved on or waited long enough; True when something was forgotten."""
        now = self.clock()
        gone = [k for k, (seq, since) in self.known.items() if last_seq_of(k) > seq or now - since > STALE_S]
        for k in gone:
            del self.known[k]
        return bool(gone)


class Placer:
    def __init__(self, memory: Memory, append: AppendFn, publish: PublishFn,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.memory = memory
        self.append = append
        self.publish = publish
        self.clock = clock
        self.wake = asyncio.Event()
        self.counters = Counters()
        self.queues: dict[str, WorkerQueue] = {}
        self.chains: dict[str, asyncio.Task[None]] = {}
        self.busy: set[ContainerKey] = set()  # a decision about it is on its way to the log
        self.stale_workers = Stale(clock)
        self.stale_containers = Stale(clock)  # keys are "workspace/container_id"
        self.deferred_at: dict[ContainerKey, int] = {}  # memory.room when it last did not fit
        self.releasing: dict[tuple[str, str, int], float] = {}
        self.held_since: dict[ContainerKey, float] = {}  # waiting while holding a slot, since (monotonic)
        self.queued = 0  # placements in the queues
        self.more = False  # a pass stopped at MAX_QUEUED: pass again once the queues have drained a bit
        self.appends = asyncio.Semaphore(128)  # deferrals and re-requests in flight
        self.inflight: set[asyncio.Task[Any]] = set()
        self.catalogues: dict[str, Catalogue] = {}  # flavor -> the newest catalogue (the service loads them)

    def spawn(self, aw: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        """A task of this placer: referenced until it ends, its failure logged, awaited by drain()."""
        task = spawn(aw, name=name, logger=log)
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)
        return task

    async def drain(self, timeout: float) -> None:
        """Let the appends in flight finish (a reservation without its ContainerScheduled would
        hold capacity until a sweep releases it)."""
        if self.inflight:
            await asyncio.wait(set(self.inflight), timeout=timeout)

    # ---- one pass ------------------------------------------------------------------------------

    def run_pass(self) -> None:
        """Decide what waits and start the appends; synchronous, so memory cannot move meanwhile."""
        self._clear_stale()
        candidates = self._candidates()
        if not candidates:
            return
        workers = {wid: self._view_of(wid, w.state) for wid, w in self.memory.workers.items()
                   if takes_work(w.state) and wid not in self.stale_workers.known}
        held = frozenset(self.memory.workers[wid].state.pool for wid in self.stale_workers.known
                         if wid in self.memory.workers)
        for step in plan(workers, candidates, held, self.memory.holders, self.catalogues,
                         access_of(self.memory.clusters)):
            self._dispatch(step)

    def _candidates(self) -> list[Container]:
        out: list[Container] = []
        room = self.memory.room
        for c in self.memory.backlog():
            if self.queued + len(out) >= MAX_QUEUED:
                self.more = True  # the chains wake the placer when they have room again
                break
            if len(out) >= PASS_LIMIT:
                self.wake.set()  # the rest in the next pass, once the loop had a turn
                break
            if c.key in self.busy or _skey(c.key) in self.stale_containers.known:
                continue
            if c.status == "pending" and self.deferred_at.get(c.key) == room:
                continue  # deferred, and no capacity appeared since
            out.append(c)
        return out

    def _view_of(self, worker_id: str, state: WorkerState) -> WorkerState:
        q = self.queues.get(worker_id)  # placed by an earlier pass, not reserved yet
        return q.view(state) if q is not None else state

    def _clear_stale(self) -> None:
        w = self.stale_workers.clear(lambda wid: self.memory.workers[wid].last_seq
                                     if wid in self.memory.workers else 1 << 62)
        c = self.stale_containers.clear(self._container_seq)
        if w or c:
            self.wake.set()

    def _container_seq(self, skey: str) -> int:
        ws, _, cid = skey.partition("/")
        c = self.memory.containers.get((ws, cid))
        return c.last_seq if c is not None else 1 << 62

    def _dispatch(self, step: Step) -> None:
        c = step.container
        if isinstance(step, Place):
            self.busy.add(c.key)
            q = self.queues.setdefault(step.worker_id, WorkerQueue())
            q.push(Queued(step, self.memory.foreign.get(step.worker_id, 0)))
            self.queued += 1
            if step.worker_id not in self.chains:
                self.chains[step.worker_id] = self.spawn(self._chain(step.worker_id), f"reserve {step.worker_id}")
        elif isinstance(step, Defer):
            if step.append:
                self.busy.add(c.key)
                self.spawn(self._defer(c, step.reason, self.memory.room), f"defer {c.container_id}")
            else:
                self.deferred_at[c.key] = self.memory.room
        elif isinstance(step, Hold):
            pass  # the next pass decides, on fresher state

    # ---- appends -------------------------------------------------------------------------------

    async def _chain(self, worker_id: str) -> None:
        """Reserve what was placed on one worker, in order, each expecting the previous one."""
        q = self.queues[worker_id]
        try:
            while q.items:
                if not await self._reserve(worker_id, q.items[0]):
                    break
                q.pop()
                self._dequeued(1)
        finally:
            self.chains.pop(worker_id, None)
            if q.items:  # a conflict (or a failure): the rest goes back to the backlog
                for item in q.items:
                    self.busy.discard(item.place.container.key)
                self._dequeued(len(q.items))
                self.wake.set()
            self.queues.pop(worker_id, None)

    def _dequeued(self, n: int) -> None:
        self.queued -= n
        if self.more and self.queued <= MAX_QUEUED // 2:
            self.more = False
            self.wake.set()

    async def _reserve(self, worker_id: str, item: Queued) -> bool:
        w = self.memory.workers.get(worker_id)
        if w is None or not takes_work(w.state) or self.memory.foreign.get(worker_id, 0) != item.foreign:
            return False  # the worker changed since the decision (not by us): decide again
        p = item.place
        c, req = p.container, p.decision.request
        ev = E.WorkerSlotReserved(worker_id=worker_id, container_id=c.container_id, workspace=c.workspace,
                                  cpu_millicores=req.cpu_millicores, memory_mib=req.memory_mib,
                                  gpu_count=req.gpu_count)
        env = envelope(ev, workspace=SYSTEM_WORKSPACE, correlation_id=c.correlation_id)
        self.memory.own.add(env.id)
        try:
            ack = await self.append(env, w.last_seq)
        except ConcurrencyConflict:
            self.memory.own.discard(env.id)
            self.counters.conflicts += 1
            self.stale_workers.mark(worker_id, w.last_seq)
            return False
        except BaseException:
            self.memory.own.discard(env.id)
            self.stale_workers.mark(worker_id, w.last_seq)  # not decided on again right away
            raise
        self.memory.apply(Message(env, ev, subject_of(env, ev)), ack.seq)
        self.spawn(self._schedule(p, ack.seq), f"schedule {c.container_id}")
        return True

    async def _schedule(self, p: Place, reserved_seq: int) -> None:
        c, d = p.container, p.decision
        assert c.request is not None
        r = c.request
        spec = r.spec if d.image is None or r.spec is None else msgspec.structs.replace(r.spec, image_ref=d.image)
        ev = E.ContainerScheduled(container_id=c.container_id, worker_id=p.worker_id, attempt=r.attempt,
                                  deployment_id=r.deployment_id, deployment_version=r.deployment_version,
                                  resources=r.resources, spec=spec, checkpoint=d.checkpoint, note=d.note,
                                  choice=d.choice, session_id=r.session_id)
        env = envelope(ev, workspace=c.workspace, correlation_id=c.correlation_id)
        try:
            ack = await self.append(env, c.last_seq)
        except ConcurrencyConflict:  # another scheduler decided first: undo our reservation only
            self.counters.conflicts += 1
            self.stale_containers.mark(_skey(c.key), c.last_seq)
            slot = Slot(c.container_id, c.workspace, d.request.cpu_millicores, d.request.memory_mib,
                        d.request.gpu_count, reserved_seq)
            self.wake.set()
            await self.release(p.worker_id, slot, "container moved on", c.correlation_id)
            return
        except BaseException:
            self.stale_containers.mark(_skey(c.key), c.last_seq)
            self.wake.set()
            raise
        finally:
            self.busy.discard(c.key)
        self.memory.apply(Message(env, ev, subject_of(env, ev)), ack.seq)
        self.counters.placed += 1
        log.debug("placed %s on %s", c.container_id, p.worker_id)

    async def _append_for(self, c: Container, env: Envelope, ev: E.Event) -> bool:
        """Append an event of container `c` expecting its last sequence (one of the deferrals and
        re-requests in flight) and fold it into memory. False on a conflict: `c` is left alone
        until a newer event of it arrives."""
        try:
            async with self.appends:
                ack = await self.append(env, c.last_seq)
        except ConcurrencyConflict:
            self.counters.conflicts += 1
            self.stale_containers.mark(_skey(c.key), c.last_seq)
            return False
        finally:
            self.busy.discard(c.key)
        self.memory.apply(Message(env, ev, subject_of(env, ev)), ack.seq)
        return True

    async def _defer(self, c: Container, reason: str, room: int) -> None:
        ev = E.PlacementDeferred(container_id=c.container_id, reason=reason)
        env = envelope(ev, workspace=c.workspace, correlation_id=c.correlation_id)
        if not await self._append_for(c, env, ev):
            self.wake.set()
            return
        self.deferred_at[c.key] = room
        self.counters.deferred += 1

    async def release(self, worker_id: str, slot: Slot, reason: str, correlation_id: str) -> None:
        key = (worker_id, slot.container_id, slot.reserved_seq)
        if self.clock() - self.releasing.get(key, -1e9) < RELEASE_AGAIN_S:
            return  # on its way already
        self.releasing[key] = self.clock()
        ev = E.WorkerSlotReleased(worker_id=worker_id, container_id=slot.container_id, reason=reason,
                                  reserved_seq=slot.reserved_seq)
        env = envelope(ev, workspace=SYSTEM_WORKSPACE, correlation_id=correlation_id or None,
                       id=release_id(worker_id, slot.container_id, slot.reserved_seq))
        self.memory.own.add(env.id)  # a release only adds room: decisions made without it still hold
        try:
            ack = await self.publish(env)
        except BaseException:
            self.memory.own.discard(env.id)
            raise
        if ack.duplicate:  # in the log already: seen (or to be seen) as it was then
            self.memory.own.discard(env.id)
        self.counters.released += 1

    def request_again(self, c: Container, event: E.ContainerRequested) -> None:
        """Request a container again: its worker was lost, or its placement was abandoned."""
        if c.key in self.busy:
            return
        self.busy.add(c.key)
        self.spawn(self._requeue(c, event), f"requeue {c.container_id}")

    async def _requeue(self, c: Container, event: E.ContainerRequested) -> None:
        env = envelope(event, workspace=c.workspace, correlation_id=c.correlation_id)
        try:
            if not await self._append_for(c, env, event):
                return
        finally:
            self.wake.set()
        self.counters.requeued += 1
        log.info("re-requested %s: %s", c.container_id, event.reason)

    def forget_settled(self) -> None:
        """Deferrals of containers that no longer wait need no memory of when they were deferred."""
        for key in [k for k in self.deferred_at if k not in self.memory.waiting]:
            del self.deferred_at[key]

    def forget_released(self) -> None:
        """Releases whose slot is gone need no memory of having been sent."""
        held = {(wid, cid, s.reserved_seq) for wid, w in self.memory.workers.items() for cid, s in w.slots.items()}
        for key in [k for k in self.releasing if k not in held]:
            del self.releasing[key]


def _skey(key: ContainerKey) -> str:
    return f"{key[0]}/{key[1]}"
