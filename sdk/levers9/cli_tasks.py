"""`levers9 tasks list|show|cancel` and `levers9 schedules list`: the task queues' tasks and the
schedules' next runs, read through the gateway (GET /api/v1/tasks, /api/v1/tasks/ID, /api/v1/schedules)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape

from levers9.cli_output import JSON_OPTION, client, console, errors, out, print_json, show_rows

tasks_app = typer.Typer(help="Tasks of task queues (@app.task_queue) and of schedules.", no_args_is_help=True)
schedules_app = typer.Typer(help="Scheduled functions (@app.schedule) and their next runs.", no_args_is_help=True)


@tasks_app.command("list")
def list_tasks(queue: Optional[str] = typer.Option(None, "--queue", help="only this queue (the function's name)"),
               status: Optional[str] = typer.Option(None, "--status", help="queued, running, retrying, succeeded, "
                                                                          "failed, expired or cancelled"),
               limit: int = typer.Option(100, "--limit", min=1, max=1000), json_out: bool = JSON_OPTION) -> None:
    """Newest first."""
    params = {k: v for k, v in {"queue": queue, "status": status, "limit": limit}.items() if v}
    with errors():
        found = client()._call("GET", "/api/v1/tasks", "listing tasks", params=params)
    show_rows(found["tasks"], ["task_id", "queue", "status", "attempt", "enqueued_at", "updated_at", "reason"], json_out)


@tasks_app.command("show")
def show_task(task_id: str, json_out: bool = JSON_OPTION) -> None:
    """A task's state, its result or error, and its output (the last attempt's)."""
    with errors():
        task = client()._call("GET", f"/api/v1/tasks/{task_id}", f"reading task {task_id}", see="levers9 tasks list")
    if json_out:
        return print_json(task)
    for key in ("task_id", "queue", "status", "attempt", "retries", "schedule_id", "tick", "updated_at"):
        if task.get(key) not in (None, ""):
            out.print(f"{key}: {escape(str(task[key]))}")
    if "result" in task:
        out.print(f"result: {escape(repr(task['result']))}")
    if task.get("error"):
        error = task["error"]
        out.print(f"error: {escape(error.get('type') or error.get('outcome', ''))}: {escape(error.get('reason', ''))}")
        if error.get("traceback"):
            out.print(escape(error["traceback"]))
    if task.get("output"):
        out.print("output:")
        out.print(escape(task["output"]))


@tasks_app.command("cancel")
def cancel_task(task_id: str) -> None:
    """Cancel a task that has not ended (its running attempt's outcome is then not recorded)."""
    with errors():
        client()._call("POST", f"/api/v1/tasks/{task_id}/cancel", f"cancelling task {task_id}", see="levers9 tasks list")
    console.print(f"task {task_id} cancelled")


@schedules_app.command("list")
def list_schedules(json_out: bool = JSON_OPTION) -> None:
    """Each scheduled function: cron, time zone, next runs and its last tick."""
    with errors():
        found = client()._call("GET", "/api/v1/schedules", "listing schedules")
    rows = [{**s, "next_runs": ", ".join(s["next_runs"])} if not json_out else s for s in found["schedules"]]
    show_rows(rows, ["name", "cron", "timezone", "next_runs", "last_tick", "last_task_id"], json_out)


def register(app: typer.Typer) -> None:
    app.add_typer(tasks_app, name="tasks")
    app.add_typer(schedules_app, name="schedules")
