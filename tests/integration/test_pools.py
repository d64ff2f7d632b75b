"""pool_delta is pure: the order of its rules is the policy."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.pool_controller.pools import BUILD_POOL, PoolConfig, PoolWorker, load_pools, pool_delta

STATUSES = ["provisioning", "registered", "ready", "lost", "drained"]


@st.composite
def fleets(draw):
    return [PoolWorker(f"w{i}", draw(st.sampled_from(STATUSES)), draw(st.booleans()), draw(st.booleans()),
                       draw(st.floats(0, 500))) for i in range(draw(st.integers(0, 6)))]


@settings(max_examples=500, deadline=None)
@given(fleet=fleets(), backlog=st.integers(0, 20), min_warm=st.integers(0, 3), max_workers=st.integers(1, 6))
def test_pool_delta_invariants(fleet, backlog, min_warm, max_workers):
    pool = PoolConfig("p", min_warm=min_warm, max_workers=max_workers, idle_timeout_s=60)
    d = pool_delta(pool, fleet, backlog)
    alive = [w for w in fleet if w.status in ("provisioning", "registered", "ready")]
    assert len(alive) + d.start <= max(max_workers, len(alive))  # never past max_workers
    assert not (d.start and d.stop)
    for wid in d.stop:  # only idle, ready, managed workers past the timeout, never below min_warm
        w = next(w for w in fleet if w.worker_id == wid)
        assert w.status == "ready" and w.managed and not w.busy and w.idle_for_s >= 60
    assert len(alive) - len(d.stop) >= min(min_warm, len(alive))
    if backlog and any(w.status in ("provisioning", "registered") for w in alive) and len(alive) >= min_warm:
        assert d.start == 0  # wait on pending capacity before provisioning more
    if d.stop:
        assert backlog == 0


def test_backlog_with_no_pending_worker_provisions_one():
    pool = PoolConfig("p", min_warm=1, max_workers=3)
    ready = [PoolWorker("a", "ready", False, True)]
    assert pool_delta(pool, ready, backlog=2).start == 1
    assert pool_delta(pool, ready + [PoolWorker("b", "provisioning", True, False)], backlog=2).start == 0
    full = [PoolWorker(x, "ready", True, True) for x in "abc"]
    assert "max_workers" in pool_delta(pool, full, backlog=1).reason


def test_min_warm_is_kept_and_idle_managed_workers_go():
    pool = PoolConfig("p", min_warm=1, max_workers=3, idle_timeout_s=30)
    assert pool_delta(pool, [], 0).start == 1
    fleet = [PoolWorker("static", "ready", False, False, 999), PoolWorker("m1", "ready", True, False, 31),
             PoolWorker("m2", "ready", True, False, 5)]
    assert pool_delta(pool, fleet, 0).stop == ("m1",)


def test_pools_file(tmp_path):
    f = tmp_path / "pools.toml"
    f.write_text('[pools.gpu]\nbackend = "local"\ngpu_type = "A100"\nmin_warm = 0\nmax_workers = 2\n')
    assert load_pools(str(f))["gpu"].gpu_type == "A100"
    f.write_text('[pools.gpu]\nbogus = 1\n')
    try:
        load_pools(str(f))
    except SystemExit as exc:
        assert "bogus" in str(exc)
    else:
        raise AssertionError("unknown key accepted")
    assert list(load_pools("")) == ["default", BUILD_POOL]


def test_the_build_pool_is_always_there_unless_the_file_defines_it(tmp_path):
    f = tmp_path / "pools.toml"
    f.write_text('[pools.gpu]\ngpu_type = "A100"\n')
    pools = load_pools(str(f))
    assert sorted(pools) == [BUILD_POOL, "gpu"]
    build = pools[BUILD_POOL]
    assert (build.min_warm, build.max_workers, build.criu) == (1, 1, False)
    f.write_text('[pools.build]\nmax_workers = 3\nmin_warm = 0\n')
    build = load_pools(str(f))[BUILD_POOL]
    assert (build.min_warm, build.max_workers, build.criu) == (0, 3, True)  # the file's, as written


# ---- the heartbeat table against a real NATS (the session's servers) ------------------------------

async def test_heartbeat_table_follows_the_bucket_through_one_consumer(servers):
    import asyncio
    import time
    import uuid

    from levers9.pool_controller.heartbeats import HeartbeatTable, still_beating
    from levers9.pool_controller.rules import HEARTBEAT_EXPIRED, WorkerState, lost_workers
    from levers9.runtime.bus import HEARTBEAT_BUCKET, Bus

    bus = await Bus.connect(servers["nats_url"])
    await bus.ensure_topology()
    stream = f"KV_{HEARTBEAT_BUCKET}"

    async def consumers() -> int:
        return (await bus.js.stream_info(stream)).state.consumer_count

    async def until(cond, timeout: float = 10.0) -> None:
        async def poll():
            while not await cond():
                await asyncio.sleep(0.02)
        await asyncio.wait_for(poll(), timeout)

    kv = await bus.heartbeats()
    wid = f"hb-{uuid.uuid4().hex[:8]}"
    before = await consumers()
    table = HeartbeatTable(lambda: bus)
    stop = asyncio.Event()
    task = asyncio.create_task(table.run(stop))
    try:
        async def synced() -> bool:
            return table.current
        await until(synced)
        await kv.put(wid, b"{}")

        async def seen() -> bool:
            return wid in table.snapshot().seen
        await until(seen)
        for _ in range(50):  # a pass reads the table from memory: no consumer per read
            table.snapshot()
        assert await consumers() == before + 1
        assert await still_beating(bus, wid) is True

        await kv.delete(wid)  # a worker that stops deletes its key

        async def gone() -> bool:
            return wid not in table.snapshot().seen
        await until(gone)
        assert await still_beating(bus, wid) is False
        now = time.time()
        registered = WorkerState(wid, "ready", since=now - 100)
        assert lost_workers([registered], table.snapshot(), now, ttl=6, grace=6) == [(wid, HEARTBEAT_EXPIRED)]
        assert table.watches == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await bus.close()
