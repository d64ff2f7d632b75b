"""Events of schedules (aggregate `schedule`, one per scheduled deployment): a tick fired.

Subjects are `levers9.<workspace>.schedule.<name>.ScheduleFired`, the deployment's name: a redeploy (a
new version) keeps its schedule's last tick, so it never fires a tick twice. The scheduler appends
each tick with the schedule's expected last sequence, so two replicas never fire one tick twice; the
tick's run is a task (TaskEnqueued) whose id is derived from the schedule and the tick.
"""

from __future__ import annotations

from .base import Event


class ScheduleFired(Event, frozen=True, kw_only=True):
    """The tick at `tick` (ISO, UTC) ran as task `task_id`; `skipped` ticks before it did not run
    (missed while the platform was down, with catch_up off, or folded into this one)."""
    AGGREGATE = "schedule"
    ID_FIELD = "schedule_id"
    schedule_id: str  # the deployment's name (its versions share one schedule)
    deployment_id: str  # the version that was live at the tick
    tick: str
    task_id: str = ""  # "" when the tick was skipped
    skipped: int = 0
