"""The heartbeat table: one long-lived watcher on the heartbeat bucket, kept in memory.

Workers put their key in the KV bucket every two seconds; the bucket's TTL drops a key three missed
beats later. Listing the keys on every pass (`kv.keys()`) costs a new JetStream consumer each time,
which the server keeps for minutes: they pile up to its limit, and then the listing fails. So the
controller watches the bucket once and records when it saw each key: the table answers from memory.

The table is `current` only while its watcher is connected and has delivered what the bucket held
when it started; on a reconnect or an error it is re-created, and meanwhile the table says it does
not know (the lost-worker rule then declares no one lost for want of a heartbeat). A heartbeat that
seems expired is confirmed with a direct read of its key (no consumer) before a worker is declared
lost, so a watcher that silently stopped delivering cannot make live workers lost either.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Callable, Protocol

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from .rules import Heartbeats

log = logging.getLogger("levers9.pool_controller.heartbeats")

SYNC_TIMEOUT_S = 10.0  # the watcher must deliver the bucket's current keys within this
IDLE_CHECK_S = 5.0  # with no update for this long, check that the connection is still the same one
RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)
WATCH_INACTIVE_S = 30.0  # a watcher consumer nobody listens to any more is removed by the server after this
DELETES = ("DEL", "PURGE")

Run = tuple[int, float]  # a worker run's pid and start time, as its heartbeats say them


class BusLike(Protocol):
    reconnects: int

    async def heartbeats(self) -> KeyValue: ...


class HeartbeatTable:
    """When each worker's heartbeat was last seen, by one watcher that lives as long as the process."""

    def __init__(self, bus: Callable[[], BusLike], clock: Callable[[], float] = time.time) -> None:
        self._bus = bus  # a callable: the service connects its bus after this table is made
        self.clock = clock
        self.seen: dict[str, float] = {}
        # the run each key's latest beat named, and when: kept through a watcher's restart (which
        # rebuilds `seen` without the keys the TTL dropped), so a lost worker's run is still known
        self.runs: dict[str, tuple[Run, float]] = {}
        self.current = False
        self.watches = 0  # watchers created so far: one per connection in a healthy process
        self.errors = 0
        self._restart = False

    def snapshot(self) -> Heartbeats:
        return Heartbeats(dict(self.seen), self.current)

    def prune(self, before: float) -> None:
        """Forget keys not seen since `before`: a worker that died without deleting its key leaves no
        event when the bucket's TTL drops it, so its entry would stay for ever."""
        for key in [k for k, at in self.seen.items() if at < before]:
            del self.seen[key]
        for key in [k for k, (_, at) in self.runs.items() if at < before]:
            del self.runs[key]

    def last_run(self, worker_id: str) -> Run | None:
        """The pid and start time of the worker's run that beat last (None: no beat said them)."""
        known = self.runs.get(worker_id)
        return known[0] if known else None

    def restart(self, why: str) -> None:
        """Drop the watcher and start a new one (the table is unknown until it has synced again)."""
        log.warning("heartbeat watcher restarts: %s", why)
        self._restart = True

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                await self._watch(stop)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive any error; the table is unknown meanwhile
                self.errors += 1
                failures += 1
                log.warning("heartbeat watcher failed (%s: %s); the table is unknown until it is back",
                            type(exc).__name__, exc)
            self.current = False
            if not stop.is_set():
                await _wait(stop, RETRY_S[min(failures, len(RETRY_S) - 1)])

    async def _watch(self, stop: asyncio.Event) -> None:
        bus = self._bus()
        connection = bus.reconnects
        kv = await bus.heartbeats()
        watcher = await kv.watchall(inactive_threshold=WATCH_INACTIVE_S)
        self.watches += 1
        self._restart = False
        try:
            await self._follow(watcher, stop, lambda: bus.reconnects != connection or self._restart)
        finally:
            self.current = False
            try:
                await watcher.stop()
            except (nats.errors.Error, OSError) as exc:  # the connection is already gone: nothing to stop
                log.info("heartbeat watcher stop: %s", exc)

    async def _follow(self, watcher: KeyValue.KeyWatcher, stop: asyncio.Event, stale: Callable[[], bool]) -> None:
        """Apply updates until stopped or the connection changes. The first updates are the bucket's
        current keys, then a None marks that the table is current."""
        table: dict[str, float] = {}
        started = self.clock()
        while not stop.is_set() and not stale():
            try:
                entry = await watcher.updates(timeout=IDLE_CHECK_S)
            except nats.errors.TimeoutError:
                if not self.current and self.clock() - started > SYNC_TIMEOUT_S:
                    raise TimeoutError(f"the watcher delivered no initial keys within {SYNC_TIMEOUT_S:.0f} s")
                continue
            if entry is None:
                self.seen, self.current = table, True
            elif isinstance(entry, KeyValue.Entry):
                _apply(table, entry, self.clock())
                if (run := run_of(entry)) is not None:
                    self.runs[entry.key] = (run, self.clock())
            else:  # the watcher was stopped under us
                return


def _apply(table: dict[str, float], entry: KeyValue.Entry, now: float) -> None:
    if entry.operation in DELETES:
        table.pop(entry.key, None)
    else:
        table[entry.key] = now


def run_of(entry: KeyValue.Entry) -> Run | None:
    """The run a beat names (its pid and start time), or None (a delete, or a beat without them)."""
    if entry.operation in DELETES or not entry.value:
        return None
    try:
        beat = json.loads(entry.value)
        return int(beat["pid"]), float(beat["started"])
    except (ValueError, KeyError, TypeError):
        return None


async def still_beating(bus: BusLike, worker_id: str) -> bool | None:
    """Whether `worker_id`'s key is in the bucket, read directly (no consumer); None when it cannot be read."""
    try:
        kv = await bus.heartbeats()
        await kv.get(worker_id)
        return True
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return False
    except (nats.errors.Error, OSError) as exc:
        log.warning("cannot read the heartbeat of %s (%s: %s); not declaring it lost", worker_id,
                    type(exc).__name__, exc)
        return None


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except asyncio.TimeoutError:
        pass

