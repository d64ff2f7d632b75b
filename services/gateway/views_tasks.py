"""The gateway's list of tasks (`gateway.tasks`): one row per task, from the task events.

What `GET /api/v1/tasks` and `levers9 tasks list` page through, and each deployment's queue depth
(`queued` and `running` rows). A task's own answer (`GET /api/v1/tasks/ID`, its result) is read from
the log itself (task_log.py); this row never holds the result. The first outcome stands: a row that
ended is never changed again, as task_state.apply folds it.
"""

from __future__ import annotations

from levers9.contracts import Message, subjects
from levers9.contracts import events as E
from levers9.contracts.task_state import ENDED, STATUS
from levers9.runtime.projection import BatchedProjection
from levers9.runtime.views import occurred

TASK_STATES = ("queued", "running", "retrying", *sorted(ENDED))
UPDATES = (E.TaskStarted, E.TaskRetried, E.TaskSucceeded, E.TaskFailed, E.TaskExpired, E.TaskCancelled)


class TasksView(BatchedProjection):
    name = "tasks"
    filter_subjects = (subjects.filter_subject(aggregate="task"),)
    tables = ("tasks",)

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.tasks (
            workspace text NOT NULL, task_id text NOT NULL, deployment_id text NOT NULL, queue text NOT NULL,
            function text NOT NULL DEFAULT '', status text NOT NULL, attempt int NOT NULL DEFAULT 1,
            reason text NOT NULL DEFAULT '', schedule_id text NOT NULL DEFAULT '', tick text NOT NULL DEFAULT '',
            enqueued_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, last_seq bigint NOT NULL,
            PRIMARY KEY (workspace, task_id))""",
                f"CREATE INDEX IF NOT EXISTS tasks_newest ON {schema}.tasks (workspace, enqueued_at, task_id)",
                f"CREATE INDEX IF NOT EXISTS tasks_depth ON {schema}.tasks (deployment_id, status)"]

    def statements(self, schema: str, msg: Message, seq: int) -> list[tuple[str, tuple]]:
        ev, env, at = msg.event, msg.envelope, occurred(msg)
        t = f"{schema}.tasks"
        if isinstance(ev, E.TaskEnqueued):
            return [(f"""INSERT INTO {t} (workspace, task_id, deployment_id, queue, function, status, schedule_id,
                             tick, enqueued_at, updated_at, last_seq)
                         VALUES ($1, $2, $3, $4, $5, 'queued', $6, $7, $8, $8, $9)
                         ON CONFLICT (workspace, task_id) DO NOTHING""",
                     (env.workspace, ev.task_id, ev.deployment_id, ev.queue, ev.function, ev.schedule_id, ev.tick,
                      at, seq))]
        if not isinstance(ev, UPDATES):
            return []
        status = STATUS[type(ev)]
        ended = tuple(ENDED)
        return [(f"""UPDATE {t} SET status = $3, attempt = GREATEST(attempt, $4), reason = $5, updated_at = $6,
                         last_seq = $7
                     WHERE workspace = $1 AND task_id = $2 AND NOT (status = ANY($8::text[]))""",
                 (env.workspace, ev.task_id, status, int(getattr(ev, "attempt", 0)),  # type: ignore[attr-defined]
                  str(getattr(ev, "reason", ""))[:500], at, seq, list(ended)))]
