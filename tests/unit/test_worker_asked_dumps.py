"""Dumps somebody asked for (a sandbox's snapshot, a notebook's idle dump) are never dropped: two of
one deployment on one worker are taken one after the other, and a claim that meets a moved log is
made again after it. An automatic dump still gives way (one checkpoint is all it wants). The bus and
the runtime are fakes (test_worker_placements)."""

from __future__ import annotations

import asyncio

import pytest
from test_worker_placements import ENABLED, RING, Appending, FakePool, FakeRuntime, published

from levers9.contracts import events as E
from levers9.contracts.envelope import decode, encode
from levers9.runtime.bus import Bus, ConcurrencyConflict
from levers9.runtime.config import Settings
from levers9.worker.lifecycle.placement import Running
from levers9.worker.service import WorkerService


@pytest.fixture
def worker(tmp_path) -> WorkerService:
    w = WorkerService(Settings().with_(home=str(tmp_path), worker_id="w1", image_cache=str(tmp_path / "cache"),
                                       gateway_url="http://gateway.test", worker_token="t0k", secret_key=RING))
    w.runtime = FakeRuntime(tmp_path)
    w.ready.set()
    return w


def container(cid: str) -> Running:
    c = Running(cid, "acme", "hello-1", f"corr-{cid}", 0.0, spec=ENABLED, deployment_version=1, memory_mib=128)
    c.ready_at = 1.0
    return c


class Dumps:
    """Stands in for the CRIU dump: records each, holds it until released, fails if two overlap."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.ended: list[str] = []
        self.release = asyncio.Event()

    async def __call__(self, c: Running, claim: str, stopping: bool = False) -> None:
        assert len(self.started) == len(self.ended), "two dumps of one deployment at once"
        self.started.append(c.container_id)
        await self.release.wait()
        self.ended.append(c.container_id)


async def until(condition, ceiling: float = 10.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), ceiling)


async def test_two_asked_dumps_of_one_deployment_are_both_taken_one_after_the_other(worker):
    worker.bus, worker.pool = Appending(), FakePool()
    worker.runtime.checkpoint_ready = True
    worker.checkpoints._dump = dumps = Dumps()
    first = asyncio.ensure_future(worker.checkpoints.checkpoint(container("c1"), manual=True))
    second = asyncio.ensure_future(worker.checkpoints.checkpoint(container("c2"), manual=True))
    await until(lambda: dumps.started == ["c1"])
    # meanwhile an automatic dump of the deployment gives way: no claim, no event
    await asyncio.wait_for(worker.checkpoints.checkpoint(container("c3")), 5)
    assert len(worker.bus.appended) == 1
    dumps.release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert dumps.ended == ["c1", "c2"]
    claimed = [decode(encode(env)).event.container_id for env, _ in worker.bus.appended]
    assert claimed == ["c1", "c2"]
    assert worker.checkpoints.dumping == set() and worker.checkpoints._turns == {}


class Conflicting(Appending):
    """The deployment's log moves on `conflicts` times before an append lands; its last seq is 7."""

    aggregate_filter = staticmethod(Bus.aggregate_filter)

    def __init__(self, conflicts: int) -> None:
        super().__init__()
        self.conflicts = conflicts

    async def append(self, env, expected_last_seq: int):
        if self.conflicts:
            self.conflicts -= 1
            raise ConcurrencyConflict(env.subject, expected_last_seq)
        await super().append(env, expected_last_seq)

    async def last_seq(self, filter_subject: str) -> int:
        return 7


async def test_an_asked_dump_claims_again_after_the_log_moved_on(worker):
    worker.bus, worker.pool = Conflicting(2), FakePool()
    worker.runtime.checkpoint_ready = True
    worker.checkpoints._dump = dumps = Dumps()
    dumps.release.set()
    await asyncio.wait_for(worker.checkpoints.checkpoint(container("c1"), manual=True), 5)
    assert [expected for _, expected in worker.bus.appended] == [7] and dumps.ended == ["c1"]


async def test_an_asked_dump_whose_claim_never_lands_fails_with_a_reason(worker):
    worker.bus, worker.pool = Conflicting(1_000), FakePool()
    worker.runtime.checkpoint_ready = True
    worker.checkpoints._dump = dumps = Dumps()
    await asyncio.wait_for(worker.checkpoints.checkpoint(container("c1"), manual=True), 5)
    [failed] = published(worker, E.CheckpointFailed)
    assert "kept moving" in failed.reason and dumps.started == []


async def test_an_automatic_dump_that_lost_its_claim_leaves_it_to_the_other_worker(worker):
    worker.bus, worker.pool = Conflicting(1), FakePool()
    worker.runtime.checkpoint_ready = True
    worker.checkpoints._dump = dumps = Dumps()
    await asyncio.wait_for(worker.checkpoints.checkpoint(container("c1")), 5)
    assert worker.bus.appended == [] and dumps.started == [] and not published(worker, E.CheckpointFailed)
