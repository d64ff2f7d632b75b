"""The build pool: always kept by the pool controller, and never a place for user containers."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.contracts.spec import DeploymentSpec
from levers9.pool_controller.pools import BUILD_POOL, DEFAULT_BUILD_POOL, PoolConfig, pool_delta, with_build_pool
from levers9.scheduler.placement import Request, WorkerState, place

POOLS = ["default", "gpu", BUILD_POOL]


@st.composite
def fleets(draw):
    return [WorkerState(f"w{i}", draw(st.sampled_from(POOLS)), "ready", draw(st.integers(500, 16000)),
                        draw(st.integers(256, 65536)), features=frozenset({"runc"}))
            for i in range(draw(st.integers(0, 8)))]


@settings(max_examples=300, deadline=None)
@given(fleet=fleets(), pool=st.sampled_from(["default", "gpu"]), cpu=st.integers(1, 4000),
       mem=st.integers(1, 8192))
def test_a_container_of_another_pool_never_lands_on_a_build_worker(fleet, pool, cpu, mem):
    chosen = place(Request("c", cpu, mem, pool=pool), fleet).worker_id
    builders = {w.worker_id for w in fleet if w.pool == BUILD_POOL}
    assert chosen not in builders
    if chosen is None and any(w.pool == pool and w.cpu_millicores >= cpu and w.memory_mib >= mem for w in fleet):
        raise AssertionError("a worker of the requested pool had room")


def test_a_deployment_asks_for_the_default_pool_unless_told():
    spec = msgspec.convert({"name": "hello", "code": {"module": "app", "handler": "hello"}}, DeploymentSpec)
    assert spec.pool == Request("c", 1, 1).pool == "default" != BUILD_POOL


@given(st.dictionaries(st.sampled_from(["default", "gpu", "cpu-big"]), st.integers(0, 3)))
def test_with_build_pool_adds_one_warm_builder(named):
    pools = {n: PoolConfig(n, min_warm=k) for n, k in named.items()}
    merged = with_build_pool(pools)
    assert merged[BUILD_POOL] == DEFAULT_BUILD_POOL
    assert {n: p for n, p in merged.items() if n != BUILD_POOL} == pools
    assert pool_delta(merged[BUILD_POOL], [], backlog=0).start == 1  # started with the stack, idle or not


def test_a_build_pool_the_file_defines_is_kept_as_written():
    own = PoolConfig(BUILD_POOL, min_warm=0, max_workers=4)
    assert with_build_pool({BUILD_POOL: own, "default": PoolConfig("default")})[BUILD_POOL] is own
