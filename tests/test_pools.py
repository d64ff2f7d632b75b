"""pool_delta is pure: the order of its rules is the policy."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.pool_controller.pools import PoolConfig, PoolWorker, load_pools, pool_delta

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
    assert list(load_pools("")) == ["default"]
