"""The heartbeat table follows one watcher, knows when it does not know, and re-creates its watcher on a
reconnect or an error. A fake bucket stands in for NATS (no server)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import nats.errors
import nats.js.errors
import pytest
from nats.js.kv import KeyValue

from levers9.pool_controller import heartbeats as hb
from levers9.pool_controller.heartbeats import HeartbeatTable, still_beating


class FakeWatcher:
    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.stopped = False

    async def updates(self, timeout: float = 5.0):
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            raise nats.errors.TimeoutError

    async def stop(self) -> None:
        self.stopped = True


class FakeKV:
    def __init__(self) -> None:
        self.watchers: list[FakeWatcher] = []
        self.fail_watch = 0  # how many of the next watchall() calls fail
        self.keys: set[str] = set()
        self.get_error: Exception | None = None

    async def watchall(self, **kwargs) -> FakeWatcher:
        assert kwargs.get("inactive_threshold"), "a watcher must not outlive the process that made it"
        if self.fail_watch:
            self.fail_watch -= 1
            raise nats.js.errors.ServiceUnavailableError
        self.watchers.append(FakeWatcher())
        return self.watchers[-1]

    async def get(self, key: str):
        if self.get_error:
            raise self.get_error
        if key not in self.keys:
            raise nats.js.errors.KeyNotFoundError
        return entry(key)


class FakeBus:
    def __init__(self) -> None:
        self.reconnects = 0
        self.kv = FakeKV()

    async def heartbeats(self) -> FakeKV:
        return self.kv


def entry(key: str, op: str | None = None, value: bytes = b"{}") -> KeyValue.Entry:
    return KeyValue.Entry(bucket="levers9_heartbeats", key=key, value=value, revision=1, delta=0, created=None,
                          operation=op)


async def until(cond, timeout: float = 5.0) -> None:
    async def poll():
        while not cond():
            await asyncio.sleep(0.005)
    await asyncio.wait_for(poll(), timeout)


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(hb, "IDLE_CHECK_S", 0.02)
    monkeypatch.setattr(hb, "RETRY_S", (0.01,))


@pytest.fixture
async def running(fast):
    bus, clock = FakeBus(), SimpleNamespace(now=100.0)
    table = HeartbeatTable(lambda: bus, clock=lambda: clock.now)
    stop = asyncio.Event()
    task = asyncio.create_task(table.run(stop))
    yield bus, table, clock
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_the_table_is_current_only_once_the_initial_keys_are_in(running):
    bus, table, clock = running
    await until(lambda: bus.kv.watchers)
    w = bus.kv.watchers[0]
    await w.queue.put(entry("a"))
    await until(lambda: w.queue.empty())
    assert table.current is False and table.snapshot().current is False  # more may be coming
    await w.queue.put(None)  # what the bucket held is all in
    await until(lambda: table.current)
    assert table.snapshot().seen == {"a": 100.0}
    clock.now = 102.0
    await w.queue.put(entry("b"))
    await w.queue.put(entry("a"))
    await until(lambda: table.seen.get("a") == 102.0)
    await w.queue.put(entry("b", op="DEL"))  # a worker that stops deletes its key
    await until(lambda: "b" not in table.seen)
    assert table.snapshot().seen == {"a": 102.0} and table.watches == 1


async def test_a_reconnect_makes_the_table_unknown_until_a_new_watcher_has_synced(running):
    bus, table, clock = running
    await until(lambda: bus.kv.watchers)
    await bus.kv.watchers[0].queue.put(entry("a"))
    await bus.kv.watchers[0].queue.put(None)
    await until(lambda: table.current)
    bus.reconnects += 1
    await until(lambda: len(bus.kv.watchers) == 2)
    assert bus.kv.watchers[0].stopped and table.current is False
    await bus.kv.watchers[1].queue.put(None)  # the bucket is empty now: "a" expired meanwhile
    await until(lambda: table.current)
    assert table.seen == {}


async def test_an_error_is_logged_and_the_watcher_comes_back(running, caplog):
    bus, table, _ = running
    await until(lambda: bus.kv.watchers)
    bus.kv.fail_watch = 2
    table.restart("test")
    await until(lambda: len(bus.kv.watchers) == 2)
    assert table.errors == 2 and "heartbeat watcher failed" in caplog.text
    await bus.kv.watchers[1].queue.put(None)
    await until(lambda: table.current)


async def test_a_watcher_that_never_syncs_is_replaced(running, monkeypatch):
    bus, table, clock = running
    monkeypatch.setattr(hb, "SYNC_TIMEOUT_S", 5.0)
    await until(lambda: bus.kv.watchers)
    clock.now += 6.0  # nothing came within the sync timeout
    await until(lambda: len(bus.kv.watchers) == 2)
    assert table.current is False and table.errors == 1


async def test_still_beating_reads_the_key_and_says_when_it_cannot():
    bus = FakeBus()
    bus.kv.keys = {"a"}
    assert await still_beating(bus, "a") is True
    assert await still_beating(bus, "b") is False
    bus.kv.get_error = nats.errors.TimeoutError()
    assert await still_beating(bus, "a") is None  # unknown: never a reason to declare it lost


def test_prune_forgets_only_keys_not_seen_since():
    table = HeartbeatTable(lambda: FakeBus())
    table.seen = {"old": 10.0, "new": 500.0}
    table.prune(before=100.0)
    assert table.seen == {"new": 500.0}


async def test_the_run_a_worker_s_beats_named_is_kept_when_a_restarted_watcher_no_longer_sees_its_key(running):
    """CI: a worker SIGKILLed, its key expired, the watcher restarted (its table rebuilt without the key),
    then `levers9 up` started the next run. The lost run must still be known by its pid and start time,
    or the reaper takes the lock's holder (that next run) for it and kills it."""
    bus, table, clock = running
    await until(lambda: bus.kv.watchers)
    await bus.kv.watchers[0].queue.put(entry("w1", value=b'{"at": 99.5, "pid": 4242, "started": 90.25}'))
    await bus.kv.watchers[0].queue.put(entry("w2"))  # a beat that does not say its run
    await bus.kv.watchers[0].queue.put(None)
    await until(lambda: table.current)
    assert table.last_run("w1") == (4242, 90.25) and table.last_run("w2") is None
    table.restart("test")
    await until(lambda: len(bus.kv.watchers) == 2)
    await bus.kv.watchers[1].queue.put(None)  # w1's key expired meanwhile
    await until(lambda: table.current)
    assert table.seen == {} and table.last_run("w1") == (4242, 90.25)
    await bus.kv.watchers[1].queue.put(entry("w1", value=b'{"at": 120.0, "pid": 5151, "started": 118.5}'))
    await until(lambda: table.last_run("w1") == (5151, 118.5))  # the next run beats: it is the one known now
    clock.now = 1000.0
    table.prune(before=500.0)
    assert table.last_run("w1") is None
