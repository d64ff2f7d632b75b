"""`Service.wait_projected`: waits in memory (no polling) until a projection has applied a stream
sequence. A Service that never connects; `advanced` is what applying a batch calls."""

from __future__ import annotations

import asyncio

import pytest

from levers9.runtime.config import Settings
from levers9.runtime.projection import Projection
from levers9.runtime.service import Service


class _View(Projection):
    def __init__(self, name: str) -> None:
        self.name = name

    def ddl(self, schema: str) -> list[str]:
        return []

    async def apply(self, conn, schema, msg, seq) -> None:  # never called: nothing is consumed here
        raise AssertionError("not consuming")


class _Svc(Service):
    name = "unit-svc"
    projections = (_View("containers"), _View("deployments"))


@pytest.fixture
def svc() -> _Svc:
    return _Svc(Settings())


async def still_waiting(task: asyncio.Task, for_s: float = 0.05) -> bool:
    """True when `task` has not finished within `for_s` (nothing it waits on has happened)."""
    done, _ = await asyncio.wait({task}, timeout=for_s)
    return not done


async def test_returns_true_once_the_named_projection_passes_the_sequence(svc):
    waiter = asyncio.create_task(svc.wait_projected(10, "containers", timeout=5))
    await svc.advanced("containers", 9)
    assert await still_waiting(waiter)
    await svc.advanced("deployments", 50)  # another projection: not what it waits for
    assert await still_waiting(waiter)
    await svc.advanced("containers", 10)
    assert await asyncio.wait_for(waiter, 5) is True


async def test_returns_false_on_timeout(svc):
    await svc.advanced("containers", 3)
    assert await svc.wait_projected(4, "containers", timeout=0.05) is False
    assert await svc.wait_projected(1, "deployments", timeout=0.05) is False  # never advanced


async def test_returns_at_once_when_already_there(svc):
    await svc.advanced("containers", 7)
    assert await svc.wait_projected(7, "containers", timeout=0) is True
    assert await svc.wait_projected(2, "containers", timeout=0) is True


async def test_waits_for_every_projection_when_none_is_named(svc):
    waiter = asyncio.create_task(svc.wait_projected(20, timeout=5))
    await svc.advanced("containers", 25)
    assert await still_waiting(waiter)
    await svc.advanced("deployments", 19)
    assert await still_waiting(waiter)
    await svc.advanced("deployments", 21)
    assert await asyncio.wait_for(waiter, 5) is True


async def test_positions_never_move_back_and_each_waiter_wakes_at_its_own_sequence(svc):
    await svc.advanced("containers", 10)
    await svc.advanced("containers", 4)  # an older batch finishing late
    assert svc.projected["containers"] == 10
    waiters = {seq: asyncio.create_task(svc.wait_projected(seq, "containers", timeout=5)) for seq in (11, 12, 30)}
    await svc.advanced("containers", 12)
    assert await asyncio.wait_for(waiters[11], 5) is True
    assert await asyncio.wait_for(waiters[12], 5) is True
    assert await still_waiting(waiters[30])
    await svc.advanced("containers", 30)
    assert await asyncio.wait_for(waiters[30], 5) is True


async def test_a_fresh_service_knows_no_position(svc):
    assert svc.projected == {}
    assert await svc.wait_projected(1, timeout=0) is False
    assert await svc.wait_projected(0, timeout=0) is True  # sequence 0: nothing to wait for


async def test_health_before_connecting_reports_nats_disconnected(svc):
    checks = await svc.checks()
    assert checks["nats"] == "disconnected"
    assert checks["postgres"].startswith("error")
