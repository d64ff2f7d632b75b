"""Running function calls: attempts with retries and backoff, the call log, spawned calls.

A call takes a slot on a sandbox of its deployment (or of its session) from the same router as
endpoint calls, runs once there (executor_client.attempt), and is tried again after a backoff
while retries remain, unless it was cancelled. Each attempt is recorded in the log
(FunctionCallStarted/FunctionCallFinished: ids, function, caller's token, attempt, duration,
outcome; never arguments or results), published in order by one background task so a call's
latency never waits for the log.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from levers9.contracts import envelope
from levers9.contracts import events as E

from .executor_client import Outcome, Sink, attempt, failed
from .router import DeploymentRouter, NoCapacity, QueueFull, StartFailed
from .state import Deployment
from .state import Gateway as GatewayState

log = logging.getLogger("levers9.gateway.functions")

BACKOFF_S = 0.5
BACKOFF_MAX_S = 10.0
DEATH_WAIT_S = 3.0  # after a connection broke: how long to wait for the sandbox's own failure event
MIN_CAPACITY_WAIT_S = 180.0  # a cold sandbox may need an image and a worker first
SPAWNED_KEPT_S = 3600.0
TRACEBACKS_KEPT = 1000  # the last failed calls' remote tracebacks, kept in memory
UNDELIVERED_TRIES = 4  # sandboxes tried in one attempt while each refuses the call before it runs


@dataclass
class Plan:
    """What every call of one stream shares, decided once."""
    dep: Deployment
    function: str  # app.name, for the log
    router: DeploymentRouter
    request_container: Callable[[], Awaitable[str]]
    header: dict[str, Any]  # the executor's call header, less call_id
    function_bytes: bytes  # the pickled function of an ad-hoc call (b"" for a deployed one)
    retries: int
    timeout: float
    workspace: str
    token_id: str
    correlation_id: str
    mode: str = "call"
    session_id: str = ""


def backoff(attempt: int) -> float:
    return min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (attempt - 1))


@dataclass(frozen=True)
class Running:
    workspace: str
    cancel: asyncio.Event


async def _follow(source: asyncio.Event, target: asyncio.Event) -> None:
    """Set `target` once `source` is set (a stream's cancel reaches each of its calls)."""
    await source.wait()
    target.set()


@dataclass
class Spawned:
    call_id: str
    workspace: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: Outcome | None = None
    attempts: int = 0
    finished_at: float = 0.0


class Calls:
    def __init__(self, gw: GatewayState) -> None:
        self.gw = gw
        self.log_queue: asyncio.Queue[tuple[E.Event, str, str]] = asyncio.Queue()
        self.spawned: dict[str, Spawned] = {}
        self.running: dict[str, Running] = {}  # calls in flight in this process, by call id
        self.tracebacks: OrderedDict[str, tuple[str, str]] = OrderedDict()  # call id -> (workspace, traceback)

    def record(self, event: E.Event, plan: Plan) -> None:
        self.log_queue.put_nowait((event, plan.workspace, plan.correlation_id))

    async def publish_log(self, stop: asyncio.Event) -> None:
        """The call log, in order (a call's Started before its Finished)."""
        while not (stop.is_set() and self.log_queue.empty()):
            try:
                event, workspace, correlation = await asyncio.wait_for(self.log_queue.get(), 0.5)
            except asyncio.TimeoutError:
                continue
            try:
                await self.gw.bus.publish(envelope(event, workspace=workspace, correlation_id=correlation))
            except Exception:  # noqa: BLE001 - the call itself went on; say what the log lacks
                log.exception("could not record %s of call %s", type(event).__name__, getattr(event, "call_id", ""))

    async def run(self, plan: Plan, call_id: str, args: bytes, sink: Sink, cancel: asyncio.Event) -> tuple[Outcome, int]:
        """Run the call with its retries; (the last attempt's outcome, attempts made). It can be
        cancelled alone (POST /api/v1/calls/{id}/cancel) as well as with its stream's `cancel`."""
        mine = self.running[call_id] = Running(plan.workspace, asyncio.Event())
        link = asyncio.create_task(_follow(cancel, mine.cancel))
        try:
            outcome, n = await self._run(plan, call_id, args, sink, mine.cancel)
        finally:
            link.cancel()
            del self.running[call_id]
        if outcome.traceback:  # kept a while for GET /api/v1/calls/{id}: the log never holds it
            self.tracebacks[call_id] = (plan.workspace, outcome.traceback)
            while len(self.tracebacks) > TRACEBACKS_KEPT:
                self.tracebacks.popitem(last=False)
        return outcome, n

    async def _run(self, plan: Plan, call_id: str, args: bytes, sink: Sink, cancel: asyncio.Event) -> tuple[Outcome, int]:
        attempts = plan.retries + 1
        for n in range(1, attempts + 1):
            began = time.monotonic()
            outcome = await self.once(plan, call_id, n, args, sink, cancel)
            retrying = not outcome.ok and outcome.kind != "cancelled" and n < attempts and not cancel.is_set()
            self.record(E.FunctionCallFinished(
                call_id=call_id, deployment_id=plan.dep.deployment_id, function=plan.function, attempt=n,
                outcome=outcome.kind, duration_ms=round((time.monotonic() - began) * 1000, 3),
                error_type=outcome.error_type, reason=outcome.reason[:500], retrying=retrying), plan)
            if not retrying:
                return outcome, n
            await sink.output(2, f"levers9: attempt {n} of {attempts} failed "
                                 f"({outcome.reason or outcome.error_type}); retrying in {backoff(n):g} s\n")
            try:
                await asyncio.wait_for(cancel.wait(), backoff(n))
            except asyncio.TimeoutError:
                pass
        raise AssertionError("unreachable")

    async def once(self, plan: Plan, call_id: str, n: int, args: bytes, sink: Sink, cancel: asyncio.Event) -> Outcome:
        """One attempt. A sandbox the call could not be delivered to (it ended before the gateway heard
        of it, or its worker refuses it) is dropped from the router and the call goes to another one,
        within the same attempt: the function never ran."""
        header = {**plan.header, "call_id": call_id}
        for _ in range(UNDELIVERED_TRIES):
            try:
                slot = await plan.router.acquire(max(plan.timeout, MIN_CAPACITY_WAIT_S), plan.request_container)
            except QueueFull as exc:
                return failed(f"the queue is full: {exc}; try again shortly")
            except NoCapacity as exc:
                return failed(f"no capacity: {exc}")
            except StartFailed as exc:
                return failed(f"the sandbox failed to start: {exc}")
            started = E.FunctionCallStarted(
                call_id=call_id, deployment_id=plan.dep.deployment_id, function=plan.function, token_id=plan.token_id,
                attempt=n, container_id=slot.container_id, mode=plan.mode, session_id=plan.session_id)
            try:
                outcome = await attempt(slot.address, header, plan.function_bytes + args, sink, plan.timeout, cancel,
                                        on_sent=functools.partial(self.record, started, plan))
            finally:
                await plan.router.release(slot)
            if not outcome.undelivered or cancel.is_set():
                break
            log.warning("call %s was not delivered to %s (%s); it goes to another sandbox", call_id,
                        slot.container_id, outcome.reason)
            await plan.router.update(slot.container_id, "unreachable")
        if outcome.lost and not outcome.undelivered:
            outcome = await self.why_lost(plan, slot.container_id, outcome)
        return outcome

    async def why_lost(self, plan: Plan, container_id: str, outcome: Outcome) -> Outcome:
        """A broken connection: the sandbox died (say why, from its own failure event) or is stuck
        past a cancel or timeout (stop it: its slot would never come back)."""
        if outcome.reason in ("cancelled",) or outcome.reason.startswith("timed out"):
            await self.gw.publish(E.ContainerStopRequested(container_id=container_id,
                                                           reason=f"a call did not stop: {outcome.reason}"),
                                  plan.workspace, plan.correlation_id)
            return outcome
        deadline = time.monotonic() + DEATH_WAIT_S
        while time.monotonic() < deadline and container_id in plan.router.containers:
            await asyncio.sleep(0.1)
        if container_id not in plan.router.containers:
            why = plan.router.last_failure or "it stopped"
            return failed(f"the sandbox died mid-call: {why}")
        return outcome

    # ---- spawned calls ---------------------------------------------------------------------------

    def spawn(self, plan: Plan, call_id: str, args: bytes) -> Spawned:
        spawned = self.spawned[call_id] = Spawned(call_id, plan.workspace)
        sink = _Discard()

        async def run() -> None:
            try:
                spawned.outcome, spawned.attempts = await self.run(plan, call_id, args, sink, asyncio.Event())
            except Exception as exc:  # noqa: BLE001 - a spawned call's failure is its result
                log.exception("spawned call %s failed", call_id)
                spawned.outcome = failed(f"the gateway failed to run it: {exc}")
            spawned.finished_at = time.time()
            spawned.done.set()
            self.forget_old()

        task = asyncio.create_task(run(), name=f"spawned {call_id}")
        self.gw.background_tasks.add(task)
        task.add_done_callback(self.gw.background_tasks.discard)
        return spawned

    def forget_old(self) -> None:
        cutoff = time.time() - SPAWNED_KEPT_S
        for cid in [c for c, s in self.spawned.items() if s.done.is_set() and s.finished_at < cutoff]:
            del self.spawned[cid]


class _Discard:
    """A spawned call's output goes to its sandbox's log only."""

    async def output(self, fd: int, text: str) -> None:
        return None

    async def item(self, value: bytes) -> None:
        return None
