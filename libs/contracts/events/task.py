"""Events of task queues (aggregate `task`): a task is enqueued, started, retried, and ends once.

Subjects are `levers9.<workspace>.task.<task_id>.<EventType>`. A task's whole life is its aggregate,
so its state is a fold of these events (levers9.contracts.task_state) and every decision about it is
appended with the aggregate's expected last sequence: a task redelivered after a crash may run
again, but only one outcome (Succeeded, Failed, Expired, Cancelled) is ever recorded.

Unlike function calls, the arguments and the result live here: the log is what makes a task
durable (no other store holds it while it waits). Both are JSON text, bounded by the gateway's
task payload limit. Every event carries the deployment id, so a reader (the autoscaler) can count a
deployment's queue from the log alone: enqueued minus ended, started ones being in flight.
"""

from __future__ import annotations

from .base import Event


class TaskEnqueued(Event, frozen=True, kw_only=True):
    """A task was put on a deployment's queue. The queue's options are copied in at enqueue time, so a
    redeploy never changes what an enqueued task was promised."""
    AGGREGATE = "task"
    ID_FIELD = "task_id"
    task_id: str
    deployment_id: str
    queue: str  # the deployment's name (POST /taskqueue/<queue>)
    function: str = ""  # app.name, for the log
    payload: str = '{"args": [], "kwargs": {}}'  # JSON text
    enqueued_at: float  # unix seconds: the TTL counts from here
    ttl_seconds: float = 3600.0  # not started by then: TaskExpired
    retries: int = 0  # attempts after the first when the function raises or times out
    retry_backoff: float = 1.0  # seconds before the first retry; doubled each time
    timeout_seconds: float = 180.0  # one attempt's limit
    callback_url: str = ""  # POSTed with the outcome, retried
    token_id: str = ""  # who enqueued it ("" for a schedule)
    schedule_id: str = ""  # a schedule's tick: the schedule and the tick's time (ISO, UTC)
    tick: str = ""


class TaskStarted(Event, frozen=True, kw_only=True):
    """An attempt began (a sandbox slot was taken). A task redelivered after a crash starts again."""
    AGGREGATE = "task"
    ID_FIELD = "task_id"
    task_id: str
    deployment_id: str
    attempt: int = 1
    container_id: str = ""
    runner: str = ""  # which gateway process ran it
    retries_used: int = 0  # totals so far (as in the last TaskRetried): the last event alone is the state
    platform_retries: int = 0


class TaskSucceeded(Event, frozen=True, kw_only=True):
    """The task's one recorded outcome: the function returned `result` (JSON text)."""
    AGGREGATE = "task"
    ID_FIELD = "task_id"
    task_id: str
    deployment_id: str
    attempt: int = 1
    result: str = "null"
    output: str = ""  # the attempt's stdout and stderr, truncated: a task's log
    duration_ms: float = 0.0


class TaskFailed(Event, frozen=True, kw_only=True):
    """The task's one recorded outcome: its last attempt failed and no retry is left."""
    AGGREGATE = "task"
    ID_FIELD = "task_id"
    task_id: str
    deployment_id: str
    attempt: int = 1
    outcome: str = "error"  # error | timeout | failed (the platform's: the sandbox died, no capacity)
    error_type: str = ""
    reason: str = ""
    traceback: str = ""
    output: str = ""
    duration_ms: float = 0.0


class TaskRetried(Event, frozen=True, kw_only=True):
    """An attempt failed and the task will run again (`attempt`) not before `not_before`."""
    AGGREGATE = "task"
    ID_FIELD = "task_id"
    task_id: str
    deployment_id: str
    attempt: int  # the next attempt's number
    not_before: float  # unix seconds
    reason: str = ""
    counted: bool = True  # False: a platform failure (a dead sandbox) that spends none of `retries`
    retries_used: int = 0  # counted retries so far, this one included
    platform_retries: int = 0  # platform retries so far, this one included


class TaskExpired(Event, frozen=True, kw_only=True):
    """The task's one recorded outcome: it was not started within its TTL."""
    AGGREGATE = "task"
    ID_FIELD = "task_id"
    task_id: str
    deployment_id: str
    reason: str


class TaskCancelled(Event, frozen=True, kw_only=True):
    """The task's one recorded outcome: someone cancelled it before it ended."""
    AGGREGATE = "task"
    ID_FIELD = "task_id"
    task_id: str
    deployment_id: str
    reason: str = ""
    token_id: str = ""
