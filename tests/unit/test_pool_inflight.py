"""The pool controller counts the workers it provisioned before its projection shows them: passes
that run back to back (before WorkerProvisioned is projected) never start more than the pool needs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from levers9.pool_controller.pools import PoolConfig, PoolWorker, pool_delta, with_unprojected

STATUSES = ("provisioning", "registered", "ready", "lost", "drained")


@st.composite
def scenes(draw):
    pool = PoolConfig("p", min_warm=draw(st.integers(0, 3)), max_workers=draw(st.integers(0, 5)))
    projected = [PoolWorker(f"w{i}", draw(st.sampled_from(STATUSES)), managed=draw(st.booleans()),
                            busy=draw(st.booleans())) for i in range(draw(st.integers(0, 4)))]
    return pool, projected, draw(st.integers(0, 5)), draw(st.integers(1, 6))


@given(scene=scenes())
def test_passes_before_the_projection_catches_up_start_no_more_than_one_pass_with_it(scene):
    pool, projected, backlog, passes = scene
    in_flight: dict[str, str] = {}
    started = 0
    for n in range(passes):  # the projection never changes between these passes
        delta = pool_delta(pool, with_unprojected(projected, in_flight, pool.name), backlog)
        for i in range(delta.start):
            in_flight[f"new{n}-{i}"] = pool.name
        started += delta.start
    # what one pass decides when the projection already shows every worker it started
    alive = sum(1 for w in projected if w.status in ("provisioning", "registered", "ready"))
    first = pool_delta(pool, projected, backlog).start
    assert started == first
    assert alive + started <= max(alive, pool.max_workers)


def test_min_warm_one_starts_one_worker_even_when_two_passes_run_before_the_projection():
    pool = PoolConfig("gpu", min_warm=1, max_workers=1)
    in_flight: dict[str, str] = {}
    for _ in range(2):
        for i in range(pool_delta(pool, with_unprojected([], in_flight, "gpu"), 0).start):
            in_flight[f"gpu-{len(in_flight)}{i}"] = "gpu"
    assert list(in_flight) == ["gpu-00"]
    # another pool's in-flight workers do not count for this one
    assert pool_delta(PoolConfig("default", min_warm=1), with_unprojected([], in_flight, "default"), 0).start == 1
