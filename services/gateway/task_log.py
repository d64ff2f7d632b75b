"""A task's state read from the log itself: its TaskEnqueued and its aggregate's last event.

Started and Retried carry the retry totals, so these two messages are the whole state
(levers9.contracts.task_state); the last one's sequence is what the next decision expects. Reading
the log (two direct gets) instead of a projection means a runner never decides on a stale view, and
`GET /api/v1/tasks/ID` sees a task the moment it was enqueued. The workspace is part of the subject:
another workspace's task is simply not found.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import nats.js.errors

from levers9.contracts import decode, subjects
from levers9.contracts import events as E
from levers9.contracts.task_state import TaskState, fold
from levers9.runtime.bus import Bus


@dataclass(frozen=True)
class Loaded:
    state: TaskState
    last_seq: int  # the aggregate's last sequence: what the next append expects
    enqueued_seq: int
    occurred_at: str = ""  # the last event's time


async def last_message(bus: Bus, subject: str) -> tuple[int, E.Event, str] | None:
    try:
        raw = await bus.js.get_last_msg(subjects.STREAM, subject)
    except nats.js.errors.NotFoundError:
        return None
    msg = decode(raw.data or b"", raw.subject)
    return raw.seq or 0, msg.event, msg.envelope.occurred_at


async def load(bus: Bus, workspace: str, task_id: str) -> Loaded | None:
    """The task's state, or None when workspace has no such task (or the id cannot be one)."""
    try:
        first = subjects.subject(workspace, "task", task_id, "TaskEnqueued")
    except ValueError:
        return None
    enqueued = await last_message(bus, first)
    if enqueued is None:
        return None
    last = await last_message(bus, subjects.aggregate_subject(workspace, "task", task_id))
    assert last is not None  # the TaskEnqueued at least
    events = [enqueued[1]] if last[0] == enqueued[0] else [enqueued[1], last[1]]
    return Loaded(fold(events), last[0], enqueued[0], last[2])


def view(loaded: Loaded) -> dict:
    """What GET /api/v1/tasks/ID answers: the state, and the outcome's result or error."""
    s = loaded.state
    enq = s.enqueued
    assert enq is not None
    out: dict = {"task_id": s.task_id, "id": s.task_id, "queue": enq.queue, "deployment_id": s.deployment_id, "function": enq.function,
                 "status": s.status, "attempt": s.attempt, "retries": enq.retries, "enqueued_at": enq.enqueued_at,
                 "ttl": enq.ttl_seconds, "schedule_id": enq.schedule_id, "tick": enq.tick,
                 "updated_at": loaded.occurred_at}
    ended = s.ended
    if isinstance(ended, E.TaskSucceeded):
        out.update(result=_json(ended.result), output=ended.output, duration_ms=ended.duration_ms)
    elif isinstance(ended, E.TaskFailed):
        out.update(error={"outcome": ended.outcome, "type": ended.error_type, "reason": ended.reason,
                          "traceback": ended.traceback}, output=ended.output, duration_ms=ended.duration_ms)
    elif isinstance(ended, (E.TaskExpired, E.TaskCancelled)):
        out.update(error={"outcome": s.status, "type": "", "reason": ended.reason, "traceback": ""})
    return out


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text
