"""A task's state as a fold of its events, and the pure decisions taken about it.

Every decision here is a function of plain values and the time (an argument): whether a task has
expired, how long before its next attempt, what an attempt's outcome leads to, and how deep each
deployment's queue is. The gateway's task runner (I/O) and the autoscaler only ask; the tests prove
the properties (tests/unit/test_task_state.py).

Why an outcome is recorded once: a runner appends its TaskStarted with the aggregate's expected last
sequence and its outcome with its own TaskStarted's sequence as the expected one. Anything appended
in between (a second runner's start after a redelivery, a cancel) makes the outcome conflict, and it
is dropped; a terminal task is never started again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable

from .events import (
    Event,
    TaskCancelled,
    TaskEnqueued,
    TaskExpired,
    TaskFailed,
    TaskRetried,
    TaskStarted,
    TaskSucceeded,
)

TERMINAL = (TaskSucceeded, TaskFailed, TaskExpired, TaskCancelled)
STATUS = {TaskEnqueued: "queued", TaskStarted: "running", TaskRetried: "retrying", TaskSucceeded: "succeeded",
          TaskFailed: "failed", TaskExpired: "expired", TaskCancelled: "cancelled"}
ENDED = frozenset({"succeeded", "failed", "expired", "cancelled"})
MAX_BACKOFF_S = 600.0
PLATFORM_RETRIES = 10  # a dead sandbox or no capacity: tried again this often beyond the task's own retries


@dataclass(frozen=True)
class TaskState:
    task_id: str = ""
    deployment_id: str = ""
    status: str = "unknown"  # unknown: no TaskEnqueued seen
    attempt: int = 0  # the attempt running, or the next one
    retries_used: int = 0  # counted retries (the function failed) so far
    platform_retries: int = 0
    enqueued: TaskEnqueued | None = None
    ended: Event | None = None  # the one outcome
    not_before: float = 0.0

    @property
    def done(self) -> bool:
        return self.status in ENDED


def apply(state: TaskState, event: Event) -> TaskState:
    """One event onto the state. An event after the outcome changes nothing: the first outcome stands."""
    if state.done or type(event) not in STATUS:
        return state
    status = STATUS[type(event)]
    if isinstance(event, TaskEnqueued):
        return replace(state, task_id=event.task_id, deployment_id=event.deployment_id, status=status, attempt=1,
                       enqueued=event)
    if isinstance(event, TaskStarted):  # Started and Retried carry the totals: the last event is the state
        return replace(state, status=status, attempt=event.attempt, retries_used=event.retries_used,
                       platform_retries=event.platform_retries)
    if isinstance(event, TaskRetried):
        return replace(state, status=status, attempt=event.attempt, not_before=event.not_before,
                       retries_used=event.retries_used, platform_retries=event.platform_retries)
    # Succeeded and Failed name their attempt: a state read from the TaskEnqueued and the outcome alone
    # (task_log) knows it too
    return replace(state, status=status, ended=event, attempt=getattr(event, "attempt", state.attempt))


def fold(events: Iterable[Event]) -> TaskState:
    state = TaskState()
    for event in events:
        state = apply(state, event)
    return state


def expired(enqueued: TaskEnqueued, now: float) -> bool:
    """Past its TTL without having started: the TTL bounds the wait in the queue, not the run."""
    return now - enqueued.enqueued_at > enqueued.ttl_seconds


def retry_delay(backoff: float, attempt: int) -> float:
    """Seconds after failed attempt `attempt` (1-based) before the next: backoff, doubled each time, capped."""
    return min(MAX_BACKOFF_S, max(0.0, backoff) * 2 ** max(0, attempt - 1))


@dataclass(frozen=True)
class Attempted:
    """How one attempt ended, as the runner saw it."""
    ok: bool
    kind: str = "ok"  # ok | error | timeout | failed (the platform's) | cancelled
    result: str = "null"
    error_type: str = ""
    reason: str = ""
    traceback: str = ""
    output: str = ""
    duration_ms: float = 0.0


@dataclass(frozen=True)
class Next:
    """What an attempt's end leads to: `kind` is succeeded | retry | failed | cancelled; a retry's
    time and the retry totals after it. The gateway turns it into the event (task_runner.outcome)."""
    kind: str
    not_before: float = 0.0
    counted: bool = True
    retries_used: int = 0
    platform_retries: int = 0


def after_attempt(state: TaskState, done: Attempted, now: float) -> Next:
    """The outcome, or a retry when one is left. A platform failure (the sandbox died under it, no
    capacity) spends none of the task's own retries, only the PLATFORM_RETRIES beside them."""
    enq = state.enqueued
    assert enq is not None, "a task runs only once enqueued"
    if done.ok:
        return Next("succeeded")
    if done.kind == "cancelled":
        return Next("cancelled")
    platform = done.kind == "failed"
    used = state.platform_retries if platform else state.retries_used
    if used >= (PLATFORM_RETRIES if platform else enq.retries):
        return Next("failed")
    delay = retry_delay(1.0 if platform else enq.retry_backoff, used + 1)
    return Next("retry", not_before=now + delay, counted=not platform,
                retries_used=state.retries_used + (not platform), platform_retries=state.platform_retries + platform)


@dataclass
class QueueDepth:
    """Each deployment's waiting and running tasks, folded from task events in log order: what the
    autoscaler reads as "queued tasks" (with the queue's tasks_per_container)."""
    tasks: dict[str, tuple[str, str]] = field(default_factory=dict)  # task id -> (deployment id, status)

    def apply(self, event: Event) -> None:
        task_id = getattr(event, "task_id", "")
        if type(event) not in STATUS or not task_id:
            return
        status = STATUS[type(event)]
        if status in ENDED:
            self.tasks.pop(task_id, None)
        elif isinstance(event, TaskEnqueued) or task_id in self.tasks:
            self.tasks[task_id] = (event.deployment_id, status)  # type: ignore[attr-defined]

    def depth(self, deployment_id: str) -> tuple[int, int]:
        """(waiting, running): waiting counts queued and retrying tasks."""
        statuses = [s for d, s in self.tasks.values() if d == deployment_id]
        running = statuses.count("running")
        return len(statuses) - running, running
