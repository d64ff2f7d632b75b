"""The router a task's call takes its sandbox slot from: it records the start and bounds the wait.

A task starts when it gets a slot, not when a runner takes it from the queue: its TaskStarted is
appended (with the task's expected last sequence) the moment the router hands the call a slot, so a
task that waits for a sandbox is still queued (the autoscaler counts it) and its TTL still runs. A
wait that outlasts the TTL ends the call as "no capacity" with `expired` set: the runner records
TaskExpired instead of a retry. A start that conflicts (cancelled meanwhile, or another runner
started it) gives the slot back at once: the function never runs for this runner.

It wraps the deployment's DeploymentRouter and passes everything else through, so the function-call
path (function_calls.Calls) uses it unchanged.
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable

from levers9.runtime.bus import ConcurrencyConflict

from .router import DeploymentRouter, NoCapacity, Slot


class StartGate:
    def __init__(self, router: DeploymentRouter, deadline: float | None,
                 on_start: Callable[[str], Awaitable[int]]) -> None:
        self._router = router
        self.deadline = deadline  # unix seconds the task must have started by; None: no limit
        self.on_start = on_start  # appends TaskStarted for a container; returns its sequence
        self.started_seq = 0
        self.expired = False
        self.conflict = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._router, name)

    async def acquire(self, timeout: float, request_container: Callable[[], Awaitable[str]]) -> Slot:
        if self.started_seq or self.deadline is None:
            slot = await self._router.acquire(timeout, request_container)
        else:
            left = self.deadline - time.time()
            if left <= 0:
                self.expired = True
                raise NoCapacity("the task's ttl passed while it waited for a sandbox")
            try:
                slot = await self._router.acquire(min(timeout, left), request_container)
            except NoCapacity:
                self.expired = time.time() >= self.deadline
                raise
        if not self.started_seq:  # the first slot of the attempt: the task starts now
            try:
                self.started_seq = await self.on_start(slot.container_id)
            except ConcurrencyConflict:
                self.conflict = True
                await self._router.release(slot)
                raise NoCapacity("the task moved on while it waited (cancelled, or started by another runner)") \
                    from None
            except BaseException:
                await self._router.release(slot)
                raise
        return slot
