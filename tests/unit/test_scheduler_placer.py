"""The scheduler's shell against an in-memory log that enforces optimistic concurrency like JetStream:
two schedulers racing never overbook, every container is scheduled once, a conflict is not retried in
a loop, lost workers' containers are requested again, finished containers' slots are released.
No servers: the log is a list, the consumers are tasks that hand its entries over in batches."""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest
from scheduler_helpers import WS, registered, requested

from levers9.contracts import Envelope, decode, encode, envelope
from levers9.contracts import events as E
from levers9.runtime.bus import Appended, ConcurrencyConflict
from levers9.runtime.config import Settings
from levers9.runtime.consumer import Delivery
from levers9.scheduler.memory import Memory
from levers9.scheduler.placer import Placer
from levers9.scheduler.service import SchedulerService

SYS = "_sys"


class FakeLog:
    """One stream: sequences from 1, the last sequence per aggregate, the duplicate window by id."""

    def __init__(self, rng: random.Random) -> None:
        self.entries: list[tuple[int, Envelope]] = []
        self.last: dict[str, int] = {}
        self.ids: dict[str, int] = {}
        self.rng = rng
        self.appends = 0
        self.grew = asyncio.Event()

    async def _lag(self) -> None:
        for _ in range(self.rng.randint(0, 2)):  # acks come back in a different order than sent
            await asyncio.sleep(0)

    async def append(self, env: Envelope, expected: int) -> Appended:
        self.appends += 1
        await self._lag()
        agg = env.subject.rsplit(".", 1)[0]
        if self.last.get(agg, 0) != expected:
            raise ConcurrencyConflict(env.subject, expected)
        return self._add(env)

    async def publish(self, env: Envelope) -> Appended:
        await self._lag()
        if env.id in self.ids:
            return Appended(self.ids[env.id], True)
        return self._add(env)

    def _add(self, env: Envelope) -> Appended:
        seq = len(self.entries) + 1
        self.entries.append((seq, env))
        self.last[env.subject.rsplit(".", 1)[0]] = seq
        self.ids[env.id] = seq
        self.grew.set()
        return Appended(seq, False)

    def events(self, type_name: str | None = None) -> list[tuple[int, E.Event]]:
        out = []
        for seq, env in self.entries:
            if type_name is None or env.type == type_name:
                out.append((seq, decode(encode(env)).event))
        return out


def boot(log: FakeLog) -> SchedulerService:
    svc = SchedulerService(Settings())
    svc.memory = Memory(seen={"containers": 0, "workers": 0})
    svc._placer = Placer(svc.memory, log.append, log.publish)
    return svc


async def feed(log: FakeLog, svc: SchedulerService, stop: asyncio.Event, rng: random.Random) -> None:
    """The two consumers of one scheduler: container and worker events, in order, in batches."""
    cursors = {"containers": 0, "workers": 0}
    while not stop.is_set():
        moved = False
        for name, aggregate in (("containers", "container"), ("workers", "worker")):
            todo = [(seq, env) for seq, env in log.entries[cursors[name]:]
                    if env.subject.split(".")[2] == aggregate][:rng.randint(1, 16)]
            if todo:
                cursors[name] = todo[-1][0]
                svc.take(name, [Delivery(seq, env.subject, encode(env), {}, 1, decode(encode(env)))
                                for seq, env in todo])
                moved = True
            else:
                cursors[name] = len(log.entries)
        if not moved:
            log.grew.clear()
            try:
                await asyncio.wait_for(log.grew.wait(), 0.05)
            except asyncio.TimeoutError:
                pass
        await asyncio.sleep(0)


async def run_schedulers(log: FakeLog, n: int, until, seed: int, timeout: float = 20.0) -> list[SchedulerService]:
    rng = random.Random(seed)
    services = [boot(log) for _ in range(n)]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(feed(log, s, stop, rng)) for s in services]
    tasks += [asyncio.create_task(s.placing(stop)) for s in services]
    try:
        async def done() -> None:
            while not until():
                for s in services:
                    s.sweep()
                await asyncio.sleep(0.01)
        await asyncio.wait_for(done(), timeout)
    finally:
        stop.set()
        for s in services:
            s.placer.wake.set()
        await asyncio.gather(*tasks)
    return services


def publish_fleet(log: FakeLog, workers: int, cpu: int, pool: str = "default") -> list[str]:
    ids = [f"{pool}-w{i}" for i in range(workers)]
    for w in ids:
        log._add(envelope(registered(w, cpu=cpu, mem=64 * 1024, pool=pool), workspace=SYS))
        log._add(envelope(E.WorkerReady(worker_id=w), workspace=SYS))
    return ids


def capacity_in_log_order(log: FakeLog) -> dict[str, int]:
    """Used cpu per worker replayed in log order as the projection counts it; asserts it never
    exceeds 1000m at any point."""
    used: dict[str, int] = {}
    slots: dict[tuple[str, str], tuple[int, int]] = {}
    for seq, ev in log.events():
        if isinstance(ev, E.WorkerSlotReserved) and (ev.worker_id, ev.container_id) not in slots:
            slots[(ev.worker_id, ev.container_id)] = (seq, ev.cpu_millicores)
            used[ev.worker_id] = used.get(ev.worker_id, 0) + ev.cpu_millicores
            assert used[ev.worker_id] <= 1000, (ev, used)
        elif isinstance(ev, E.WorkerSlotReleased):
            held = slots.get((ev.worker_id, ev.container_id))
            if held and ev.reserved_seq in (0, held[0]):
                used[ev.worker_id] -= slots.pop((ev.worker_id, ev.container_id))[1]
    return used


def last_status(log: FakeLog) -> dict[str, str]:
    out = {}
    for _, ev in log.events():
        if isinstance(ev, (E.ContainerRequested, E.ContainerScheduled, E.PlacementDeferred)):
            out[ev.container_id] = type(ev).__name__
    return out


@pytest.mark.parametrize("seed", range(6))
async def test_two_schedulers_racing_never_overbook_and_schedule_each_container_once(seed):
    log = FakeLog(random.Random(seed))
    publish_fleet(log, 4, cpu=1000, pool="ob")
    cids = [f"c{i}" for i in range(20)]
    for cid in cids:
        log._add(envelope(requested(cid, cpu=500, mem=128, pool="ob"), workspace=WS))

    def decided() -> bool:
        status = last_status(log)
        return all(status.get(c) in ("ContainerScheduled", "PlacementDeferred") for c in cids) and \
            sum(1 for v in status.values() if v == "ContainerScheduled") == 8

    services = await run_schedulers(log, 2, decided, seed)
    used = capacity_in_log_order(log)
    assert used == {f"ob-w{i}": 1000 for i in range(4)}
    scheduled = [ev.container_id for _, ev in log.events("ContainerScheduled")]
    assert len(scheduled) == len(set(scheduled)) == 8
    # a conflict is followed by a decision on fresh state, not a loop of appends that conflict again
    # (200 seeds: at most 45 conflicts and 106 appends for these 20 containers)
    assert sum(s.placer.counters.conflicts for s in services) < 80, [s.placer.counters for s in services]
    assert log.appends < 200


async def test_a_worker_whose_appends_conflict_is_not_tried_again_until_something_newer_is_seen():
    """Someone appended to the worker and we have not seen it yet: one attempt, then the worker is
    stale; the container is held (not deferred: the pool has room we cannot see yet)."""
    log = FakeLog(random.Random(0))
    publish_fleet(log, 1, cpu=1000)
    svc = boot(log)
    batch = [Delivery(seq, env.subject, encode(env), {}, 1, decode(encode(env))) for seq, env in log.entries]
    svc.take("workers", batch)
    log._add(envelope(E.WorkerCordoned(worker_id="default-w0"), workspace=SYS))  # never delivered
    env = envelope(requested("c0", cpu=100), workspace=WS)
    seq = log._add(env).seq
    svc.take("containers", [Delivery(seq, env.subject, encode(env), {}, 1, decode(encode(env)))])
    stop = asyncio.Event()
    placing = asyncio.create_task(svc.placing(stop))
    for _ in range(50):  # passes keep running (the sweep wakes the placer every time)
        svc.sweep()
        await asyncio.sleep(0.002)
    stop.set()
    svc.placer.wake.set()
    await placing
    assert svc.placer.counters.conflicts == 1 and log.appends == 1
    assert not log.events("PlacementDeferred") and not log.events("ContainerScheduled")


async def test_one_scheduler_places_a_large_backlog_and_every_placement_carries_what_the_worker_needs():
    log = FakeLog(random.Random(1))
    publish_fleet(log, 100, cpu=16000)
    cids = [f"c{i}" for i in range(2000)]
    for cid in cids:
        log._add(envelope(requested(cid, cpu=250, mem=256, note="cold: checkpoint_enabled is off"), workspace=WS))
    # a bound on liveness, not a speed target (bench/ measures placement): CI's loaded run took > 20 s
    await run_schedulers(log, 1, lambda: len(log.events("ContainerScheduled")) == 2000, seed=1, timeout=180)
    events = log.events("ContainerScheduled")
    assert len({ev.container_id for _, ev in events}) == 2000
    for _, ev in events:
        assert ev.resources.cpu_millicores == 250 and ev.deployment_id == "d1" and ev.deployment_version == 3
        assert ev.checkpoint is None and ev.note == "cold: checkpoint_enabled is off"
    reserved = log.events("WorkerSlotReserved")
    per_worker: dict[str, int] = {}
    for _, ev in reserved:
        per_worker[ev.worker_id] = per_worker.get(ev.worker_id, 0) + ev.cpu_millicores
    assert max(per_worker.values()) <= 16000 and len(reserved) == 2000
    assert not log.events("PlacementDeferred")


async def test_a_lost_workers_containers_are_requested_again_and_placed_elsewhere_and_its_slots_freed():
    log = FakeLog(random.Random(2))
    publish_fleet(log, 2, cpu=1000)
    # a session's sandbox: its placement names the session, again after its worker is lost (the worker
    # keeps its keep-warm for it though its deployment is autoscaled)
    log._add(envelope(msgspec.structs.replace(requested("c0", cpu=600), session_id="s1"), workspace=WS))
    await run_schedulers(log, 1, lambda: len(log.events("ContainerScheduled")) == 1, seed=2)
    [(_, first)] = log.events("ContainerScheduled")
    assert first.session_id == "s1"
    log._add(envelope(E.WorkerLost(worker_id=first.worker_id), workspace=SYS))
    await run_schedulers(log, 1, lambda: len(log.events("ContainerScheduled")) == 2
                         and len(log.events("WorkerSlotReleased")) == 1, seed=3)
    again = [ev for _, ev in log.events("ContainerRequested")][-1]
    assert again.attempt == 2 and again.excluded_workers == []
    assert again.resources.cpu_millicores == 600
    second = log.events("ContainerScheduled")[-1][1]
    assert second.worker_id != first.worker_id and second.attempt == 2 and second.session_id == "s1"
    [(_, released)] = log.events("WorkerSlotReleased")
    assert released.worker_id == first.worker_id and released.container_id == "c0"


async def test_a_stopped_containers_slot_is_released_once_and_nothing_waits_forever():
    log = FakeLog(random.Random(4))
    publish_fleet(log, 1, cpu=1000)
    log._add(envelope(requested("c0", cpu=1000), workspace=WS))
    log._add(envelope(requested("c1", cpu=1000), workspace=WS))
    await run_schedulers(log, 1, lambda: len(log.events("ContainerScheduled")) == 1
                         and len(log.events("PlacementDeferred")) == 1, seed=4)
    [(_, first)] = log.events("ContainerScheduled")
    log._add(envelope(E.ContainerStopped(container_id=first.container_id, worker_id=first.worker_id),
                      workspace=WS))
    # the slot comes free: the deferred one is placed in its stead
    await run_schedulers(log, 1, lambda: len(log.events("ContainerScheduled")) == 2, seed=5)
    assert len(log.events("WorkerSlotReleased")) == 1
    assert capacity_in_log_order(log) == {"default-w0": 1000}


async def test_what_is_finished_is_forgotten_so_memory_stays_flat():
    """Stopped containers whose slots were released, their deferrals and their releases leave the
    scheduler's memory (the projection keeps them)."""
    log = FakeLog(random.Random(6))
    publish_fleet(log, 1, cpu=1000)
    log._add(envelope(requested("c0", cpu=1000), workspace=WS))
    log._add(envelope(requested("c1", cpu=1000), workspace=WS))
    stopped: set[str] = set()

    def stop_what_is_scheduled() -> bool:  # each container stops once placed: c0, then c1 in its stead
        for _, ev in log.events("ContainerScheduled"):
            if ev.container_id not in stopped:
                stopped.add(ev.container_id)
                log._add(envelope(E.ContainerStopped(container_id=ev.container_id, worker_id=ev.worker_id),
                                  workspace=WS))
        return stopped == {"c0", "c1"} and len(log.events("WorkerSlotReleased")) == 2

    [svc] = await run_schedulers(log, 1, stop_what_is_scheduled, seed=6)
    for name, aggregate in (("containers", "container"), ("workers", "worker")):  # what the feed had not brought
        svc.take(name, [Delivery(seq, env.subject, encode(env), {}, 1, decode(encode(env)))
                        for seq, env in log.entries if env.subject.split(".")[2] == aggregate
                        and seq > svc.memory.seen.get(name, 0)])
    svc.sweep()
    assert svc.memory.containers == {} and svc.memory.waiting == {} and svc.memory.holders == {}
    assert svc.placer.deferred_at == {} and svc.placer.releasing == {} and svc.placer.busy == set()
    assert capacity_in_log_order(log) == {"default-w0": 0}


def feed_all(log: FakeLog, svc: SchedulerService) -> None:
    for name, aggregate in (("containers", "container"), ("workers", "worker")):
        svc.take(name, [Delivery(seq, env.subject, encode(env), {}, 1, decode(encode(env)))
                        for seq, env in log.entries if env.subject.split(".")[2] == aggregate
                        and seq > svc.memory.seen.get(name, 0)])


async def test_a_placement_abandoned_between_its_two_appends_is_asked_for_again_and_placed():
    """A scheduler stopped after reserving a slot and before ContainerScheduled: the container
    waits while holding that slot, on the only worker, which has room for it once more (so it is
    neither placed there a second time nor deferred). After ABANDONED_S (the clock is an argument)
    it is requested again, which releases the slot as for any container that moved on, and it is
    placed. (Where nothing else fits, its PlacementDeferred releases the slot the same way.)"""
    log = FakeLog(random.Random(7))
    publish_fleet(log, 1, cpu=2000)
    log._add(envelope(requested("c0", cpu=1000), workspace=WS))
    log._add(envelope(E.WorkerSlotReserved(worker_id="default-w0", container_id="c0", workspace=WS,
                                           cpu_millicores=1000, memory_mib=256), workspace=SYS))
    svc = boot(log)
    stop = asyncio.Event()
    placing = asyncio.create_task(svc.placing(stop))
    now = 1000.0
    try:
        for _ in range(200):
            feed_all(log, svc)
            svc.sweep(now)
            await asyncio.sleep(0.002)
            if log.events("ContainerScheduled"):
                break
            now += 1.0
    finally:
        stop.set()
        svc.placer.wake.set()
        await placing
    again = log.events("ContainerRequested")
    assert len(again) == 2 and again[1][1].reason == "its placement was abandoned" and again[1][1].attempt == 1
    assert not log.events("PlacementDeferred")
    assert now - 1000.0 >= 10  # not before ABANDONED_S
    [(_, released)] = log.events("WorkerSlotReleased")
    assert released.container_id == "c0" and released.reserved_seq == log.events("WorkerSlotReserved")[0][0]
    assert [ev.worker_id for _, ev in log.events("ContainerScheduled")] == ["default-w0"]
    assert capacity_in_log_order(log) == {"default-w0": 1000}
