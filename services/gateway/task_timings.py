"""Where a task's time goes in this gateway, by phase, logged every LOG_EVERY_S while tasks run.

Phases of one delivery, in order: `read` (the task's state: from the message itself, or the log's
direct gets), `plan` (the deployment and the call's plan), `slot` (waiting for a sandbox slot),
`started` (appending TaskStarted), `call` (the function in the sandbox, through the worker's relay),
`outcome` (appending the outcome). The log line gives each phase's mean in milliseconds and how many
tasks it covers: the figures behind README's task benchmarks, and the first thing to read when a
queue drains slowly.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

log = logging.getLogger("levers9.gateway.tasks")

LOG_EVERY_S = 10.0
PHASES = ("read", "plan", "slot", "started", "call", "outcome")


class Lap:
    """One task's clock: `lap(phase)` charges the time since the previous lap to that phase."""

    def __init__(self, timings: "Timings") -> None:
        self.timings = timings
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.timings.add(phase, now - self.last)
        self.last = now


class Timings:
    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self.logged = time.monotonic()

    def lap(self) -> Lap:
        return Lap(self)

    def add(self, phase: str, seconds: float) -> None:
        self.total[phase] += seconds
        self.count[phase] += 1

    def maybe_log(self) -> None:
        if time.monotonic() - self.logged < LOG_EVERY_S or not self.count:
            return
        self.logged = time.monotonic()
        parts = [f"{p} {1000 * self.total[p] / self.count[p]:.1f} ms" for p in PHASES if self.count.get(p)]
        log.info("task phases over %d tasks (mean per task): %s", self.count.get("read", 0), ", ".join(parts))
        self.total.clear()
        self.count.clear()
