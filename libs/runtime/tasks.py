"""Background tasks that are never lost: a reference is held until the task ends, and a task that
ends with an exception says so in the log (an unobserved failure would otherwise vanish, or surface
as "Task exception was never retrieved" long after the fact).

    from levers9.runtime.tasks import spawn
    spawn(self.checkpoint(c), name=f"checkpoint {c.id}")
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Coroutine, TypeVar

log = logging.getLogger("levers9.tasks")

T = TypeVar("T")

_running: set[asyncio.Task[Any]] = set()  # the references asyncio itself does not keep


def spawn(aw: Awaitable[T], *, name: str | None = None, logger: logging.Logger | None = None) -> asyncio.Task[T]:
    """Run `aw` as a task; keep it referenced until it ends and log its exception if it fails."""
    task = asyncio.create_task(_coroutine(aw), name=name)
    _running.add(task)
    task.add_done_callback(_running.discard)
    task.add_done_callback(lambda t: log_failure(t, logger or log))
    return task


def log_failure(task: asyncio.Future[Any], logger: logging.Logger = log) -> None:
    """A done-callback: log the exception a task ended with (a cancellation is not a failure)."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
        logger.error("task %s died: %r", name, exc, exc_info=exc)


def running() -> int:
    """How many spawned tasks have not ended yet."""
    return len(_running)


def _coroutine(aw: Awaitable[T]) -> Coroutine[Any, Any, T]:
    if asyncio.iscoroutine(aw):
        return aw

    async def wrap() -> T:
        return await aw

    return wrap()
