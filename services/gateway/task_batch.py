"""A batch of tasks in one request (`POST /taskqueue/NAME/batch`): what its body may be, and how its
publishes are gathered. Pure except `publish_all`, which only awaits what it is given.

Why a batch: a task put one per request costs the gateway a whole HTTP request (FastAPI, its
middleware, auth) for one publish; a batch pays that once for up to MAX_ITEMS publishes, sent to
the log concurrently. Each item is what a single put takes and is held to the same limit, so every
TaskEnqueued still fits one message of the log.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

from fastapi import HTTPException

from .routes_functions import arguments

MAX_ITEMS = 1000
IN_FLIGHT = 256  # publishes awaiting their ack at once: enough to fill the pipe to NATS, bounded memory


class BatchRefused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def payloads(body: bytes, item_limit: int, max_items: int = MAX_ITEMS) -> list[str]:
    """Each item's arguments as a single put would store them (`{"args": [...], "kwargs": {...}}`).
    BatchRefused: 422 for a body that is not a non-empty JSON array of at most `max_items` items or
    an item a single put would refuse, 413 for an item over `item_limit` bytes; both name the item."""
    try:
        items = json.loads(body) if body.strip() else None
    except ValueError as exc:
        raise BatchRefused(422, f"the body is not JSON: {exc}") from None
    if not isinstance(items, list):
        raise BatchRefused(422, 'send a JSON array of tasks, each {"args": [...], "kwargs": {...}} or keyword arguments')
    if not items:
        raise BatchRefused(422, "the batch is empty: send at least one task")
    if len(items) > max_items:
        raise BatchRefused(422, f"the batch has {len(items)} tasks; at most {max_items} per request: split it")
    out = []
    for i, item in enumerate(items):
        raw = json.dumps(item).encode()
        if len(raw) > item_limit:
            raise BatchRefused(413, f"task {i} of the batch: its arguments are {len(raw)} bytes; the limit is "
                                    f"{item_limit}")
        try:
            out.append(arguments(raw).decode())
        except HTTPException as exc:
            raise BatchRefused(exc.status_code, f"task {i} of the batch: {exc.detail}") from None
    return out


@dataclass(frozen=True)
class Published:
    ids: list[str]  # enqueued, in the batch's order
    failed: list[tuple[str, str]]  # (task id, why) not known to be enqueued


async def publish_all(ids: Iterable[str], publish: Callable[[str], Awaitable[object]],
                      in_flight: int = IN_FLIGHT) -> Published:
    """`publish(task_id)` for each id, at most `in_flight` at once; never raises for one that fails
    (a publish is idempotent by its id, so the caller may put the failed ones again)."""
    gate = asyncio.Semaphore(in_flight)

    async def one(task_id: str) -> str:
        async with gate:
            try:
                await publish(task_id)
            except Exception as exc:  # noqa: BLE001 - each failure is reported with its task id
                return f"{type(exc).__name__}: {exc}"
            return ""

    todo = list(ids)
    why = await asyncio.gather(*(one(t) for t in todo))
    return Published([t for t, w in zip(todo, why, strict=True) if not w],
                     [(t, w) for t, w in zip(todo, why, strict=True) if w])
