"""Routing calls of one deployment to its containers, holding them while none is ready.

State is in memory, fed by the container events the gateway projects (no polling): which
containers of a deployment are live, which are ready with an address, how many calls each serves.
A call takes a slot on a ready container with spare concurrency; otherwise it waits (a bounded
queue), and more containers are requested while the waiting calls outnumber what the starting
ones will absorb, up to max_containers. A container that fails while calls wait for it fails
those calls with its reason instead of leaving them to time out.

Every decision (take a slot, request more, give up) is made holding `changed`, and a request is
registered before that lock is let go: so the containers a router counts as live never exceed
max_containers, whatever the interleaving of calls, container events, releases and timeouts
(tests/unit/test_gateway_burst.py). That holds per router: the gateway keeps exactly one per
deployment version (state.Gateway.router_for).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from levers9.contracts.autoscaling import starts_for_waiting
from levers9.runtime.views import ENDED  # its process is gone

LIVE = {"requested", "pending", "scheduled", "starting", "ready"}


class NoCapacity(Exception):
    """No container became ready in time: 503 with Retry-After."""


class QueueFull(Exception):
    """`max_queue` calls already wait for a container: 429 with Retry-After, at once."""


class StartFailed(Exception):
    """The container started for these calls failed: 502 with the reason."""


@dataclass
class Slot:
    container_id: str
    status: str
    address: str = ""
    inflight: int = 0
    restored: bool = False  # its process came from a checkpoint (Server-Timing says "restored")
    seen: dict[str, float] = field(default_factory=dict)  # status -> when this gateway first heard it (monotonic)
    last_used: float = 0.0  # unix time its last call here ended: the autoscaler's idle clock (load_report.py)
    ended: str = ""  # "failed: REASON" or "stopped: REASON" once its container is gone (calls to it are cut)
    watches: set[Watch] = field(default_factory=set)  # the waits on this container now (proxy.cut_if_ended)

    def saw(self, status: str) -> None:
        self.seen.setdefault(status, time.monotonic())

    def end(self, status: str, reason: str) -> None:
        """Its container is gone: each wait on it still under way is cut CUT_GRACE_S from now. A process
        killed without its connections closing (out of memory, with its network torn down) held its
        calls for their whole timeout, and a call held so is one the autoscaler counts with no container."""
        if self.ended:
            return
        self.ended = f"{status}: {reason or 'no reason given'}"
        for watch in self.watches:
            watch.arm()


CUT_GRACE_S = 2.0  # what a container sent before it ended is still read: a wait is cut only this long after


@dataclass(eq=False)
class Watch:
    """One wait (an answer's head, a part of its body) on a container: cut (its task cancelled) once it
    has lasted CUT_GRACE_S past the container's end; a wait over by then is never touched."""
    task: asyncio.Task
    cut: bool = False
    timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        if self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(CUT_GRACE_S, self.fire)

    def fire(self) -> None:
        self.cut = True
        self.task.cancel()

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


@dataclass
class DeploymentRouter:
    deployment_id: str
    concurrency: int
    max_containers: int
    max_queue: int = 1000
    containers: dict[str, Slot] = field(default_factory=dict)
    waiting: int = 0
    peak_waiting: int = 0  # the most calls waiting at once since the meter last took it (take_peak)
    last_failure: str = ""
    failures: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    pending: int = 0  # requests sent whose container is not registered yet: they count as starting ones
    heard: set[str] | None = None  # while its containers load from the database: those events told of first
    # containers no longer routed to (stopping, unreachable) that calls still wait on: ended when theirs does
    leaving: dict[str, Slot] = field(default_factory=dict)

    def live(self) -> list[Slot]:
        return [s for s in self.containers.values() if s.status in LIVE]

    def free_slot(self) -> Slot | None:
        ready = [s for s in self.containers.values() if s.status == "ready" and s.address
                 and s.inflight < self.concurrency]
        return min(ready, key=lambda s: s.inflight) if ready else None

    def wanted(self) -> int:
        """How many more containers the waiting calls justify (pure: from the current state)."""
        live = self.live()
        starting = sum(1 for s in live if s.status != "ready") + self.pending
        return starts_for_waiting(self.waiting, starting, len(live) + self.pending, self.concurrency,
                                  self.max_containers)

    async def request(self, request_container: Callable[[], Awaitable[str]]) -> None:
        """Ask for one more container. The request counts from before it is sent until its container is
        registered, even when the call that sent it gives up meanwhile: a request once sent goes on (its
        ContainerRequested may be in the log already), and a router that forgot it asked for more."""
        self.pending += 1
        sent = asyncio.ensure_future(request_container())

        def registered(task: asyncio.Future[str]) -> None:
            self.pending -= 1
            if not task.cancelled() and task.exception() is None:
                # an event may have told of it first (the lock was let go by a call that gave up)
                self.containers.setdefault(task.result(), Slot(task.result(), "requested")).saw("requested")
        sent.add_done_callback(registered)
        await asyncio.shield(sent)

    def begin_loading(self) -> None:
        """From now until `loaded`, events may tell of containers before the database rows do."""
        self.heard = set()

    async def loaded(self, rows: list[tuple[str, str, str]]) -> None:
        """The live containers read from the database (id, status, address), read after `begin_loading`:
        a container an event told of since is as new or newer in the router than in its row (an
        event is projected before it is routed), so only the others are taken from the rows."""
        async with self.changed:
            heard, self.heard = self.heard or set(), None
            for container_id, status, address in rows:
                if container_id not in heard and container_id not in self.containers and status in LIVE:
                    self.containers[container_id] = Slot(container_id, status, address)
            self.changed.notify_all()

    async def update(self, container_id: str, status: str, address: str = "", reason: str = "",
                     restored: bool = False) -> None:
        async with self.changed:
            if self.heard is not None:
                self.heard.add(container_id)
            if status in ENDED and container_id in self.leaving:
                self.leaving.pop(container_id).end(status, reason)
            slot = self.containers.get(container_id)
            if slot is None or (slot.status == "ready" and status in LIVE and status != "ready"):
                # new, or re-requested (its worker was lost: it starts again elsewhere, at a new address):
                # calls still in flight to the old address keep the old slot, and take none of the new one's
                if slot is not None:
                    slot.end("lost", "it is started again elsewhere")
                slot = self.containers[container_id] = Slot(container_id, status)
            slot.status = status
            slot.saw(status)
            slot.restored = slot.restored or restored
            if address:
                slot.address = address
            if status in ("failed",) and reason:
                self.last_failure = reason
                self.failures += 1
            if status not in LIVE:
                self.containers.pop(container_id, None)
                self.leave(slot, status, reason)
            self.changed.notify_all()

    def leave(self, slot: Slot, status: str, reason: str) -> None:
        """`slot` is routed to no more: ended now, or (stopping, unreachable) watched for its end while
        calls still wait on it (a stopping container finishes the calls it has)."""
        if status in ENDED:
            slot.end(status, reason)
        elif slot.inflight > 0:
            self.leaving[slot.container_id] = slot

    async def acquire(self, timeout: float, request_container: Callable[[], Awaitable[str]]) -> Slot:
        """A slot on a ready container: at once when one has room, else after waiting in the queue
        (QueueFull when `max_queue` calls already wait: the caller should come back, not hang)."""
        deadline = time.monotonic() + timeout
        failures_seen = self.failures
        async with self.changed:
            slot = self.free_slot()
            if slot is not None:
                slot.inflight += 1
                return slot
            if self.waiting >= self.max_queue:
                raise QueueFull(f"{self.waiting} calls already wait for this deployment "
                                f"(its max_pending is {self.max_queue})")
            self.waiting += 1
            self.peak_waiting = max(self.peak_waiting, self.waiting)
            try:
                return await self.wait_for_slot(deadline, timeout, failures_seen, request_container)
            finally:
                self.waiting -= 1
                if self.waiting and self.free_slot() is not None:
                    # a call that leaves (timed out, cancelled) may have been the one a release woke:
                    # the slot it did not take goes to the next waiting call (the lock is held here:
                    # Condition.wait takes it back before its cancellation comes out)
                    self.changed.notify(1)

    async def wait_for_slot(self, deadline: float, timeout: float, failures_seen: int,
                            request_container: Callable[[], Awaitable[str]]) -> Slot:
        """Wait (holding `changed` between wake-ups) until a slot is free, asking for the containers the
        waiting calls justify; StartFailed when every container failed since the call came."""
        while True:
            slot = self.free_slot()
            if slot is not None:
                slot.inflight += 1
                return slot
            if self.failures > failures_seen and not self.live():
                raise StartFailed(self.last_failure)
            for _ in range(self.wanted()):
                await self.request(request_container)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoCapacity(f"no container became ready within {timeout:.0f} s")
            # in this task, not in wait_for's: a call cancelled again while wait_for waited for
            # its inner wait to take the lock back left at once and let go of a lock another call
            # held ("cannot wait on un-acquired lock", found by test_gateway_burst's property)
            try:
                async with asyncio.timeout(remaining):
                    await self.changed.wait()
            except TimeoutError:
                pass

    def take_peak(self) -> int:
        """The most calls that waited at once since the last take (the queue-depth chart's sample); the
        peak starts again from the calls waiting now."""
        peak, self.peak_waiting = self.peak_waiting, self.waiting
        return peak

    async def release(self, slot: Slot) -> None:
        """Give the slot back and wake ONE waiting call: one slot fits one call. Waking them all made
        every release cost a pass of every waiting call (200 callers on 20 containers: ~36,000 wake-ups
        a second, the gateway's whole CPU and a sixth of the throughput the containers had room for)."""
        async with self.changed:
            slot.inflight -= 1
            slot.last_used = time.time()
            if slot.inflight <= 0 and self.leaving.get(slot.container_id) is slot:
                del self.leaving[slot.container_id]
            self.changed.notify(1)
