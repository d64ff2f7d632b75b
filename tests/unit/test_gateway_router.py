"""The gateway's per-deployment router, driven by container events as the gateway feeds it."""

from __future__ import annotations

import asyncio

import pytest

from levers9.gateway.router import DeploymentRouter, NoCapacity, StartFailed


async def test_calls_wait_for_a_container_then_share_it_up_to_concurrency():
    r = DeploymentRouter("d", concurrency=2, max_containers=3)
    requested: list[str] = []

    async def request():
        requested.append(f"c{len(requested)}")
        return requested[-1]

    calls = [asyncio.create_task(r.acquire(5, request)) for _ in range(4)]
    await asyncio.sleep(0.05)
    assert len(requested) == 2  # 4 waiting calls / concurrency 2
    await r.update("c0", "ready", "http://10.0.0.2:8000")
    await asyncio.sleep(0.05)
    done = [c for c in calls if c.done()]
    assert len(done) == 2 and all(c.result().container_id == "c0" for c in done)
    await r.update("c1", "ready", "http://10.0.0.3:8000")
    slots = await asyncio.gather(*calls)
    assert sorted(s.container_id for s in slots) == ["c0", "c0", "c1", "c1"]
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
    await asyncio.sleep(0.05)
    await r.update("c1", "failed", reason="app failed to start: ImportError: no module named nope")
    with pytest.raises(StartFailed, match="ImportError"):
        await call


async def test_the_queue_is_bounded():
    r = DeploymentRouter("d", concurrency=1, max_containers=1, max_queue=2)

    async def request():
        return "c1"

    waiting = [asyncio.create_task(r.acquire(1, request)) for _ in range(2)]
    await asyncio.sleep(0.02)
    with pytest.raises(NoCapacity, match="already waiting"):
        await r.acquire(1, request)
    for w in waiting:
        w.cancel()
