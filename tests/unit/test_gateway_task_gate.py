"""The task's StartGate (levers9.gateway.task_gate): a task starts when its call gets a slot, the wait
for one is bounded by its TTL, and a start that conflicts gives the slot back without running."""

from __future__ import annotations

import asyncio
import time

import pytest

from levers9.gateway.router import NoCapacity, Slot
from levers9.gateway.task_gate import StartGate
from levers9.runtime.bus import ConcurrencyConflict


class FakeRouter:
    def __init__(self, free_after: float | None) -> None:
        self.free_after = free_after  # seconds until a slot is free; None: never
        self.released: list[Slot] = []
        self.timeouts: list[float] = []
        self.containers = {"c1": object()}

    async def acquire(self, timeout: float, request_container) -> Slot:
        self.timeouts.append(timeout)
        if self.free_after is None or self.free_after > timeout:
            await asyncio.sleep(min(timeout, 0.05))
            raise NoCapacity("no sandbox in time")
        return Slot(container_id="c1", status="ready", address="exec://x")

    async def release(self, slot: Slot) -> None:
        self.released.append(slot)


async def nothing() -> str:
    return ""


async def test_the_task_starts_once_when_it_gets_a_slot_and_other_calls_pass_through():
    starts: list[str] = []

    async def on_start(container_id: str) -> int:
        starts.append(container_id)
        return 42

    router = FakeRouter(free_after=0)
    gate = StartGate(router, time.time() + 60, on_start)  # type: ignore[arg-type]
    await gate.acquire(180, nothing)
    await gate.acquire(180, nothing)  # the same attempt, delivered to another sandbox: no second start
    assert starts == ["c1"] and gate.started_seq == 42 and not gate.expired
    assert "c1" in gate.containers  # the rest is the router's


async def test_the_wait_for_a_slot_is_bounded_by_the_ttl_and_marks_the_task_expired():
    router = FakeRouter(free_after=None)
    gate = StartGate(router, time.time() + 0.01, lambda c: asyncio.sleep(0, 1))  # type: ignore[arg-type]
    with pytest.raises(NoCapacity):
        await gate.acquire(180, nothing)
    assert router.timeouts[0] <= 0.01 and gate.expired and not gate.started_seq
    late = StartGate(FakeRouter(free_after=0), time.time() - 1, lambda c: asyncio.sleep(0, 1))  # type: ignore[arg-type]
    with pytest.raises(NoCapacity, match="ttl"):
        await late.acquire(180, nothing)
    assert late.expired


async def test_no_capacity_before_the_ttl_is_not_an_expiry():
    gate = StartGate(FakeRouter(free_after=None), time.time() + 3600, lambda c: asyncio.sleep(0, 1))  # type: ignore[arg-type]
    with pytest.raises(NoCapacity):
        await gate.acquire(0.01, nothing)
    assert not gate.expired


async def test_a_start_that_conflicts_gives_the_slot_back():
    async def conflict(container_id: str) -> int:
        raise ConcurrencyConflict("levers9.acme.task.t.TaskStarted", 3)

    router = FakeRouter(free_after=0)
    gate = StartGate(router, None, conflict)  # type: ignore[arg-type]
    with pytest.raises(NoCapacity, match="moved on"):
        await gate.acquire(180, nothing)
    assert gate.conflict and len(router.released) == 1 and not gate.started_seq
