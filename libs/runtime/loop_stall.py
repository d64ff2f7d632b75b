"""How late a process's event loop runs what is due, and where it was stuck when it was very late.

Everything a service does shares one event loop: a blocking call on it (a synchronous read, a big
JSON decode, a subprocess waited on without await) delays every request, heartbeat and proxied byte
of the process at once, and shows elsewhere as a timeout that nobody can explain (the worker's egress
proxy answering a build step nothing for a minute). So each process measures the lateness of a
periodic tick (`levers9_event_loop_lag_seconds`), and a watchdog thread, which runs while the loop
does not, logs the loop thread's stack once per stall that lasts `STALL_S`: the stall's cause, named.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

from prometheus_client import Histogram

log = logging.getLogger("levers9.runtime.loop_stall")

LOOP_LAG = Histogram("levers9_event_loop_lag_seconds", "How late the event loop ran a periodic tick",
                     buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
TICK_S = 0.25
STALL_S = 2.0


def lateness(due: float, now: float) -> float:
    """How long after `due` a tick ran (never negative: a tick early by the clock's grain is on time)."""
    return max(0.0, now - due)


def stalled(last_tick: float, now: float, reported: float | None, stall_s: float = STALL_S) -> bool:
    """Whether the watchdog should report now: no tick for `stall_s`, and this stall (the one that
    began after `last_tick`) not reported yet."""
    return now - last_tick >= stall_s and reported != last_tick


class StallWatch:
    """The loop's tick (a task) and the watchdog (a daemon thread) of one process."""

    def __init__(self, stall_s: float = STALL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_s, self.clock = stall_s, clock
        self.last_tick = clock()
        self.stalls = 0
        self._reported: float | None = None
        self._loop_thread = threading.get_ident()
        self._done = threading.Event()
        self.watchdog: threading.Thread | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until `stop`; the watchdog thread lives as long as this does."""
        self._loop_thread, self.last_tick = threading.get_ident(), self.clock()
        self.watchdog = threading.Thread(target=self._watch, name="levers9 loop-stall watchdog", daemon=True)
        self.watchdog.start()
        try:
            while not stop.is_set():
                due = self.clock() + TICK_S
                try:
                    await asyncio.wait_for(stop.wait(), TICK_S)
                except asyncio.TimeoutError:
                    pass
                now = self.clock()
                LOOP_LAG.observe(lateness(due, now) if not stop.is_set() else 0.0)
                self.last_tick = now
        finally:
            self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(self.stall_s / 4):
            last, now = self.last_tick, self.clock()
            if stalled(last, now, self._reported, self.stall_s):
                self._reported = last
                self.stalls += 1
                log.warning("event loop stalled for %.1f s so far, in:\n%s", now - last, self.stack(),
                            extra={"fields": {"stalled_s": round(now - last, 1)}})

    def stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(the loop's thread is gone)"
