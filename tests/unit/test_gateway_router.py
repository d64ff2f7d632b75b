"""The gateway's per-deployment router, driven by container events as the gateway feeds it."""

from __future__ import annotations

import asyncio
from typing import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.gateway.router import LIVE, DeploymentRouter, NoCapacity, QueueFull, Slot, StartFailed


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the other tasks run until `condition` holds (fails after `timeout` seconds)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0)


async def test_calls_wait_for_a_container_then_share_it_up_to_concurrency():
    r = DeploymentRouter("d", concurrency=2, max_containers=3)
    requested: list[str] = []

    async def request():
        requested.append(f"c{len(requested)}")
        return requested[-1]

    calls = [asyncio.create_task(r.acquire(5, request)) for _ in range(4)]
    await until(lambda: len(requested) >= 2)
    assert len(requested) == 2  # 4 waiting calls / concurrency 2
    await r.update("c0", "ready", "http://10.0.0.2:8000")
    await until(lambda: sum(c.done() for c in calls) >= 2)
    done = [c for c in calls if c.done()]
    assert len(done) == 2 and all(c.result().container_id == "c0" for c in done)
    await r.update("c1", "ready", "http://10.0.0.3:8000")
    slots = await asyncio.gather(*calls)
    assert sorted(s.container_id for s in slots) == ["c0", "c0", "c1", "c1"]
    assert len(requested) == 2
    for s in slots:
        await r.release(s)
    assert all(s.inflight == 0 for s in r.containers.values())


async def test_never_more_than_max_containers():
    r = DeploymentRouter("d", concurrency=1, max_containers=2)
    n = 0

    async def request():
        nonlocal n
        n += 1
        return f"c{n}"

    calls = [asyncio.create_task(r.acquire(0.3, request)) for _ in range(10)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert n == 2
    assert all(isinstance(x, NoCapacity) for x in results)


async def test_a_failed_start_fails_the_waiting_calls_with_its_reason():
    r = DeploymentRouter("d", concurrency=1, max_containers=1)

    async def request():
        return "c1"

    call = asyncio.create_task(r.acquire(5, request))
    await until(lambda: "c1" in r.containers)
    await r.update("c1", "failed", reason="app failed to start: ImportError: no module named nope")
    with pytest.raises(StartFailed, match="ImportError"):
        await call


async def test_the_queue_is_bounded():
    r = DeploymentRouter("d", concurrency=1, max_containers=1, max_queue=2)

    async def request():
        return "c1"

    waiting = [asyncio.create_task(r.acquire(1, request)) for _ in range(2)]
    await until(lambda: r.waiting == 2)
    with pytest.raises(QueueFull, match="max_pending is 2"):
        await r.acquire(1, request)
    for w in waiting:
        w.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert r.waiting == 0


async def test_a_full_queue_still_lets_a_call_take_a_free_slot_and_zero_means_no_wait():
    r = DeploymentRouter("d", concurrency=2, max_containers=1, max_queue=0)

    async def request():
        return "c1"

    with pytest.raises(QueueFull):  # nothing is ready and nobody may wait
        await r.acquire(1, request)
    await r.update("c1", "ready", "http://10.0.0.2:8000", restored=True)
    slot = await r.acquire(1, request)  # a free slot needs no queue
    assert (slot.container_id, slot.restored, r.waiting) == ("c1", True, 0)
    assert {"ready"} <= set(slot.seen)


# ---- how many containers the waiting calls justify (pure: from the router's state) --------------

statuses = st.sampled_from(sorted(LIVE | {"stopping"}))


@given(concurrency=st.integers(1, 8), max_containers=st.integers(1, 10), waiting=st.integers(0, 100),
       containers=st.lists(statuses, max_size=12))
def test_wanted_is_enough_for_the_waiting_calls_but_never_past_max(concurrency, max_containers, waiting, containers):
    r = DeploymentRouter("d", concurrency=concurrency, max_containers=max_containers)
    r.containers = {f"c{i}": Slot(f"c{i}", s, "http://x" if s == "ready" else "") for i, s in enumerate(containers)}
    r.waiting = waiting
    live = [s for s in containers if s in LIVE]
    starting = sum(1 for s in live if s != "ready")
    more = r.wanted()
    assert more >= 0
    assert more == 0 or len(live) + more <= max_containers  # never past max
    # enough: the starting and the new ones absorb every waiting call, unless max is reached
    assert (starting + more) * concurrency >= waiting or len(live) + more >= max_containers
    # no more than needed: one fewer would not absorb them
    assert more == 0 or (starting + more - 1) * concurrency < waiting


@given(concurrency=st.integers(1, 4), inflight=st.lists(st.integers(0, 4), max_size=6))
def test_a_call_takes_the_least_busy_ready_container_with_room(concurrency, inflight):
    r = DeploymentRouter("d", concurrency=concurrency, max_containers=10)
    r.containers = {f"c{i}": Slot(f"c{i}", "ready", "http://x", n) for i, n in enumerate(inflight)}
    slot = r.free_slot()
    room = [n for n in inflight if n < concurrency]
    if not room:
        assert slot is None
    else:
        assert slot is not None and slot.inflight == min(room)
