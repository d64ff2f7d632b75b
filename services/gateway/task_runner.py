"""Running tasks: a durable work consumer of the task events, each task run as a function call.

Why the log drives it: a task is a TaskEnqueued (or a TaskRetried) in JetStream, acked only once the
attempt's outcome is appended, so a gateway SIGKILLed mid-task leaves the message unacked and the
server hands it to another runner (this gateway's next life, or a replica) after ACK_WAIT_S. The
task may therefore run twice (README says so); its outcome is recorded once, because every
decision is appended with the task aggregate's expected last sequence (task_state.py explains why).

One work consumer per gateway pulls from a durable consumer shared by the replicas, in batches of
what it has room for, and runs up to `task_runners` tasks at once (LEVERS9_TASK_RUNNERS). A task's first delivery is decided from
the message itself (its own stream sequence is the task's expected last one; `assumed`), so a task
costs no read of the log unless something else moved it meanwhile. A task runs through the same path as
`POST /function/APP/NAME` (function_plans.plan_for, Calls.run): its deployment's router, its
sandboxes, JSON arguments in and a JSON result out. The function's own retries are not used: a
failed attempt becomes a TaskRetried, itself a message that waits for its `not_before`. The call
takes its slot through a StartGate (task_gate.py): the task starts (TaskStarted) when it gets a
sandbox, and a task that waits for one past its TTL expires.

Terminal events pass through the same consumer: a queue with a callback_url gets the outcome POSTed,
and a refused or failed POST is redelivered with backoff (MAX_DELIVER times, then dead-lettered).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Awaitable, Callable, cast

from levers9.contracts import envelope, subjects, uuid7
from levers9.contracts import events as E
from levers9.contracts.proto import functions_pb2 as pb
from levers9.contracts.task_state import Attempted, TaskState, after_attempt, expired, fold
from levers9.runtime.bus import Appended, ConcurrencyConflict
from levers9.runtime.consumer import Delivery, WorkConsumer

from . import task_log
from .callers import Caller
from .executor_client import Outcome
from .function_plans import plan_for
from .function_targets import TargetError
from .router import DeploymentRouter
from .routes_functions import Collected
from .state import Deployment
from .state import Gateway as GatewayState
from .task_gate import StartGate
from .task_timings import Lap, Timings

log = logging.getLogger("levers9.gateway.tasks")

DURABLE = "gateway-tasks"
ACK_WAIT_S = 15.0  # a runner that died with a task: redelivered after this (in-progress beats keep it)
MAX_DELIVER = 10
CONFLICT_TRIES = 5
RESULT_LIMIT = 256 << 10  # a result larger than this fails the task: it would not fit the log's message
OUTPUT_KEPT = 16 << 10  # the tail of an attempt's output kept in its outcome: the task's log
CALLBACK_TIMEOUT_S = 10.0
KNOWN_KEPT = 10_000  # outcomes remembered as needing no callback
DEPLOYMENT_TTL_S = 2.0
TERMINAL = (E.TaskSucceeded, E.TaskFailed, E.TaskExpired, E.TaskCancelled)
# what a runner acts on: work (enqueued, retried) and outcomes (callbacks); never TaskStarted
FILTERS = [subjects.filter_subject(aggregate="task", event_type=t.__name__)
           for t in (E.TaskEnqueued, E.TaskRetried, *TERMINAL)]


@dataclass(frozen=True)
class StartGateArgs:
    deadline: float | None  # the task must start by then (its TTL); None: no limit (a retry)
    on_start: Callable[[str], Awaitable[int]]
    lap: Lap


class CallbackFailed(Exception):
    """The callback URL did not take the outcome: redelivered, so POSTed again later."""


class TaskRunner:
    def __init__(self, gw: GatewayState) -> None:
        self.gw = gw
        self.runner_id = f"{socket.gethostname()}-{os.getpid()}"
        self.calls: dict[str, str] = {}  # task id -> the call id of its attempt running here
        # tasks whose outcome this process recorded and that have no callback: their outcome's delivery
        # needs no read of the log (most outcomes come back to the runner that recorded them)
        self.no_callback: OrderedDict[str, None] = OrderedDict()
        self.deployments: dict[tuple[str, str], tuple[float, Deployment | None]] = {}
        self.timings = Timings()

    async def run(self, stop: asyncio.Event) -> None:
        consumer = WorkConsumer(self.gw.bus, DURABLE, FILTERS, handle=self.handle, batch=self.gw.settings.gateway.task_runners,
                                concurrency=self.gw.settings.gateway.task_runners, ack_wait=ACK_WAIT_S, max_deliver=MAX_DELIVER)
        await consumer.run(stop)

    async def handle(self, d: Delivery) -> None:
        assert d.message is not None
        ev, env = d.message.event, d.message.envelope
        if isinstance(ev, (E.TaskEnqueued, E.TaskRetried)):
            await self.drive(env.workspace, ev, env.correlation_id, d)
            self.timings.maybe_log()
        elif isinstance(ev, TERMINAL):
            await self.callback(env.workspace, ev.task_id)

    def cancel_here(self, task_id: str) -> bool:
        """Stop the task's attempt when it runs in this process (its outcome then conflicts anyway)."""
        functions = self.gw.functions
        running = functions.calls.running.get(self.calls.get(task_id, "")) if functions is not None else None
        if running is not None:
            running.cancel.set()
        return running is not None

    # ---- one task ---------------------------------------------------------------------------------

    async def drive(self, workspace: str, ev: E.TaskEnqueued | E.TaskRetried, correlation: str,
                    d: Delivery | None = None) -> None:
        """Take the task one step on, from what the log says now; a conflict means someone moved it
        in the meantime: look again."""
        for n in range(CONFLICT_TRIES):
            lap = self.timings.lap()
            loaded = await self.assumed(workspace, ev, d) if n == 0 else None
            if loaded is None:
                loaded = await task_log.load(self.gw.bus, workspace, ev.task_id)
            lap.lap("read")
            if loaded is None or loaded.state.done:
                return
            s = loaded.state
            if isinstance(ev, E.TaskEnqueued) and s.attempt > 1 or isinstance(ev, E.TaskRetried) and ev.attempt != s.attempt:
                return  # an older message of the task: its latest TaskRetried drives it
            try:
                await self.step(workspace, loaded, correlation, lap)
                return
            except ConcurrencyConflict:
                continue
        log.warning("task %s: the log kept moving under %d tries; its next message drives it", ev.task_id,
                    CONFLICT_TRIES)

    async def assumed(self, workspace: str, ev: E.TaskEnqueued | E.TaskRetried, d: Delivery | None) -> task_log.Loaded | None:
        """The task's state on the assumption that the message delivered is the aggregate's last event
        (its first delivery: nothing moved the task since, almost always), read from the message
        itself and its stream sequence: no read of the log for a TaskEnqueued, one (its TaskEnqueued)
        for a TaskRetried. The assumption is checked where it matters: the next append expects that
        sequence, so if anything came after it (a cancel, another runner's start) the append
        conflicts and `drive` reads the log. None: read the log (a redelivery, or no message)."""
        if d is None or d.num_delivered > 1 or d.message is None:
            return None
        occurred_at = d.message.envelope.occurred_at
        if isinstance(ev, E.TaskEnqueued):
            return task_log.Loaded(fold([ev]), d.seq, d.seq, occurred_at)
        try:
            first_subject = subjects.subject(workspace, "task", ev.task_id, "TaskEnqueued")
        except ValueError:
            return None
        first = await task_log.last_message(self.gw.bus, first_subject)
        if first is None:
            return None
        return task_log.Loaded(fold([first[1], ev]), d.seq, first[0], occurred_at)

    async def step(self, workspace: str, loaded: task_log.Loaded, correlation: str, lap: Lap) -> None:
        s, enq = loaded.state, loaded.state.enqueued
        assert enq is not None
        now = time.time()
        if s.status == "queued" and expired(enq, now):
            await self.append(workspace, E.TaskExpired(
                task_id=s.task_id, deployment_id=s.deployment_id,
                reason=f"ttl: not started within {enq.ttl_seconds:g} s of being enqueued"), loaded.last_seq, correlation)
            return
        if s.status == "retrying" and s.not_before > now:
            await asyncio.sleep(s.not_before - now)  # the consumer keeps the message in progress meanwhile
        if self.gw.functions is None:
            raise ConnectionError("function calls are not up yet")  # transient: redelivered, not counted
        dep = await self.deployment(workspace, s.deployment_id)
        if dep is None:
            await self.append(workspace, E.TaskFailed(
                task_id=s.task_id, deployment_id=s.deployment_id, attempt=s.attempt, outcome="failed",
                reason=f"deployment {s.deployment_id} is stopped or deleted"), loaded.last_seq, correlation)
            return
        async def on_start(container_id: str) -> int:  # the router handed the call a slot: it starts now
            lap.lap("slot")
            start = E.TaskStarted(task_id=s.task_id, deployment_id=s.deployment_id, attempt=s.attempt,
                                  container_id=container_id, runner=self.runner_id, retries_used=s.retries_used,
                                  platform_retries=s.platform_retries)
            seq = (await self.append(workspace, start, loaded.last_seq, correlation)).seq
            lap.lap("started")
            return seq

        deadline = enq.enqueued_at + enq.ttl_seconds if s.status == "queued" else None
        done, gate = await self.attempt(workspace, dep, s, correlation, StartGateArgs(deadline, on_start, lap))
        lap.lap("call")
        if gate is not None and gate.conflict:
            raise ConcurrencyConflict(f"task {s.task_id}", loaded.last_seq, "it moved on while waiting for a sandbox")
        await self.record(workspace, s, done, gate, loaded.last_seq, correlation)
        lap.lap("outcome")

    async def record(self, workspace: str, s: TaskState, done: Attempted, gate: StartGate | None, last_seq: int,
                     correlation: str) -> None:
        """The attempt's outcome (or the expiry of a task that found no sandbox within its TTL), expecting
        the task's last event to be this attempt's start (or, never started, what it was before)."""
        enq = s.enqueued
        assert enq is not None
        if gate is not None and gate.expired:
            outcome: E.Event = E.TaskExpired(task_id=s.task_id, deployment_id=s.deployment_id,
                                             reason=f"ttl: not started within {enq.ttl_seconds:g} s of being "
                                                    "enqueued (no sandbox was free)")
        else:
            outcome = outcome_event(s, done, time.time())
        expected = gate.started_seq if gate is not None and gate.started_seq else last_seq
        try:
            await self.append(workspace, outcome, expected, correlation)
        except ConcurrencyConflict:  # cancelled, or another runner started it again: its record stands
            log.info("task %s: attempt %d's outcome not recorded: the task moved on meanwhile", s.task_id, s.attempt)
            return
        if not enq.callback_url and isinstance(outcome, TERMINAL):
            self.no_callback[s.task_id] = None
            while len(self.no_callback) > KNOWN_KEPT:
                self.no_callback.popitem(last=False)

    async def attempt(self, workspace: str, dep: Deployment, s: TaskState, correlation: str,
                      starting: StartGateArgs) -> tuple[Attempted, StartGate | None]:
        enq = s.enqueued
        assert enq is not None and self.gw.functions is not None
        functions = self.gw.functions
        caller = Caller(workspace=workspace, token_id=enq.token_id)
        began = time.monotonic()
        try:
            plan = await plan_for(self.gw, functions.sessions, caller, dep,
                                  pb.FunctionRef(app=dep.spec.app_name, name=dep.name), "", "task", correlation)
        except TargetError as exc:
            return Attempted(ok=False, kind="failed", reason=str(exc)), None
        starting.lap.lap("plan")
        gate = StartGate(plan.router, starting.deadline, starting.on_start)
        plan.router = cast(DeploymentRouter, gate)
        plan.header = {**plan.header, "json": True, "generator": False, "timeout": enq.timeout_seconds}
        plan.retries, plan.timeout = 0, enq.timeout_seconds
        call_id = self.calls[s.task_id] = uuid7()
        sink = Collected()
        try:
            outcome, _ = await functions.calls.run(plan, call_id, enq.payload.encode(), sink, asyncio.Event())
        finally:
            self.calls.pop(s.task_id, None)
        return attempted(outcome, "".join(sink.out), (time.monotonic() - began) * 1000), gate

    # ---- the log and the rest -----------------------------------------------------------------------

    async def append(self, workspace: str, event: E.Event, expected: int, correlation: str) -> Appended:
        return await self.gw.bus.append(envelope(event, workspace=workspace, correlation_id=correlation), expected)

    async def deployment(self, workspace: str, deployment_id: str) -> Deployment | None:
        """The task's deployment version while active, read at most every DEPLOYMENT_TTL_S (a task run
        just after a stop fails on its own: the version's sandboxes are going)."""
        at, dep = self.deployments.get((workspace, deployment_id), (0.0, None))
        if time.monotonic() - at > DEPLOYMENT_TTL_S:
            row = await self.gw.pool.fetchrow("SELECT * FROM gateway.deployments WHERE workspace=$1 AND "
                                              "deployment_id=$2", workspace, deployment_id)
            dep = Deployment.from_row(row) if row is not None and row["status"] == "active" else None
            self.deployments[(workspace, deployment_id)] = (time.monotonic(), dep)
        return dep

    async def callback(self, workspace: str, task_id: str) -> None:
        if self.no_callback.pop(task_id, 0) is None:
            return
        loaded = await task_log.load(self.gw.bus, workspace, task_id)
        enq = loaded.state.enqueued if loaded is not None else None
        if loaded is None or enq is None or not enq.callback_url:
            return
        try:
            answer = await self.gw.http.post(enq.callback_url, json=task_log.view(loaded), timeout=CALLBACK_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - any failure to deliver is retried the same way
            raise CallbackFailed(f"callback {enq.callback_url}: {type(exc).__name__}: {exc}") from None
        if answer.status_code >= 400:
            raise CallbackFailed(f"callback {enq.callback_url} answered {answer.status_code}")


def attempted(outcome: Outcome, output: str, duration_ms: float) -> Attempted:
    """An executor outcome as the task's decision sees it; a result too large for the log fails it."""
    tail = output[-OUTPUT_KEPT:]
    ms = round(duration_ms, 3)
    if outcome.ok:
        value = (outcome.value or b"null").decode("utf-8", "replace")
        if len(value) > RESULT_LIMIT:
            return Attempted(ok=False, kind="error", error_type="ResultTooLarge", output=tail, duration_ms=ms,
                             reason=f"the result is {len(value)} bytes; a task's result may be {RESULT_LIMIT}")
        return Attempted(ok=True, result=value, output=tail, duration_ms=ms)
    return Attempted(ok=False, kind=outcome.kind, error_type=outcome.error_type,
                     reason=outcome.reason or outcome.error, traceback=outcome.traceback, output=tail, duration_ms=ms)


def outcome_event(s: TaskState, done: Attempted, now: float) -> E.Event:
    """The event an attempt's end leads to (task_state.after_attempt decides which)."""
    nxt = after_attempt(s, done, now)
    ids = {"task_id": s.task_id, "deployment_id": s.deployment_id}
    if nxt.kind == "succeeded":
        return E.TaskSucceeded(**ids, attempt=s.attempt, result=done.result, output=done.output,
                               duration_ms=done.duration_ms)
    if nxt.kind == "retry":
        return E.TaskRetried(**ids, attempt=s.attempt + 1, not_before=nxt.not_before, counted=nxt.counted,
                             reason=(done.reason or done.error_type)[:500], retries_used=nxt.retries_used,
                             platform_retries=nxt.platform_retries)
    if nxt.kind == "cancelled":
        return E.TaskCancelled(**ids, reason=done.reason or "cancelled while running")
    return E.TaskFailed(**ids, attempt=s.attempt, outcome=done.kind, error_type=done.error_type,
                        reason=done.reason[:2000], traceback=done.traceback[-8000:], output=done.output,
                        duration_ms=done.duration_ms)
