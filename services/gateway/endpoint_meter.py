"""The meter of endpoint (HTTP) calls: per (workspace, deployment, minute) counts and a latency histogram,
kept in memory until the gateway flushes them (endpoint_store.py). Pure: no clock, no I/O.

Endpoint calls are proxied by the gateway and appended to no event (one event per HTTP call would double
the log for the busiest thing users deploy), so the meter is what GET /deployments/{name}/stats reads
for them. Latency is kept as counts over fixed buckets, not the values: the counts of any number of
replicas and restarts add up in the table (an upsert that sums), and p50/p99 come from the summed
counts, off by at most the width of the bucket the exact percentile falls in.

The buffer is bounded: past MAX_PENDING keys a call is dropped and counted (`dropped`), so a flush that
keeps failing costs memory once, never the calls themselves.
"""

from __future__ import annotations

import bisect
import datetime as dt
from dataclasses import dataclass, field
from typing import Iterable

# bucket i counts latencies in (BOUNDS_MS[i-1], BOUNDS_MS[i]] (bucket 0: up to BOUNDS_MS[0]), the last
# one (index len(BOUNDS_MS)) everything above. Stored as int[] in gateway.endpoint_minutes by index: so
# these bounds may never change (another set needs another column), only be appended to at the top.
BOUNDS_MS: tuple[float, ...] = tuple(round(0.5 * 1.25 ** i, 3) for i in range(64))  # 0.5 ms .. ~623 s
SLOTS = len(BOUNDS_MS) + 1
MAX_PENDING = 20_000  # (workspace, deployment, minute) keys and first answers held between flushes
MAX_SEEN = 100_000  # containers whose first answer is already sent: forgotten wholesale past this


def slot(ms: float) -> int:
    """The bucket index of one latency."""
    return bisect.bisect_left(BOUNDS_MS, ms)


def bucket_range(i: int) -> tuple[float, float]:
    """The (low, high] latencies bucket i counts; the top bucket's high is its low (nothing is known above)."""
    low = BOUNDS_MS[i - 1] if i > 0 else 0.0
    return low, BOUNDS_MS[i] if i < len(BOUNDS_MS) else low


def histogram(values: Iterable[float]) -> list[int]:
    counts = [0] * SLOTS
    for ms in values:
        counts[slot(ms)] += 1
    return counts


def add_counts(a: list[int], b: list[int]) -> list[int]:
    """Element-wise sum; a shorter list (stored before bounds were appended) counts as zeros."""
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def bucket_percentile(counts: list[int], q: float) -> float | None:
    """The nearest-rank percentile (q in 0..1) estimated from bucket counts: the middle of the bucket the
    ceil(n q)-th smallest value falls in (None for no values). The exact value lies in that bucket."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = max(1, -(-total * q // 1))
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank:
            low, high = bucket_range(min(i, len(BOUNDS_MS)))
            return round((low + high) / 2, 3)
    return None  # not reached: seen == total >= rank at the end


@dataclass
class Minute:
    calls: int = 0
    errors: int = 0
    counts: list[int] = field(default_factory=lambda: [0] * SLOTS)
    queued_peak: int = 0  # the most calls waiting for a container at once in the minute (any replica's)


MinuteKey = tuple[str, str, dt.datetime]  # workspace, deployment id, the minute (UTC, truncated)
AnswerKey = tuple[str, str]  # workspace, container id


@dataclass
class EndpointMeter:
    minutes: dict[MinuteKey, Minute] = field(default_factory=dict)
    answers: dict[AnswerKey, dt.datetime] = field(default_factory=dict)  # first answers not yet flushed
    seen: set[AnswerKey] = field(default_factory=set)  # first answers already taken: not sent again
    dropped: int = 0  # calls and answers not kept for a full buffer, since the gateway started

    def add(self, workspace: str, deployment_id: str, status: int, ms: float, at: dt.datetime) -> None:
        """One call that answered `status` after `ms`, ended at `at` (aware). A 5xx is an error."""
        key = (workspace, deployment_id, at.astimezone(dt.timezone.utc).replace(second=0, microsecond=0))
        m = self.minutes.get(key)
        if m is None:
            if len(self.minutes) >= MAX_PENDING:
                self.dropped += 1
                return
            m = self.minutes[key] = Minute()
        m.calls += 1
        m.errors += status >= 500
        m.counts[slot(ms)] += 1

    def queued(self, workspace: str, deployment_id: str, peak: int, at: dt.datetime) -> None:
        """A sample of a deployment's wait queue: `peak` calls waited at once shortly before `at`."""
        if peak <= 0:
            return
        key = (workspace, deployment_id, at.astimezone(dt.timezone.utc).replace(second=0, microsecond=0))
        m = self.minutes.get(key)
        if m is None:
            if len(self.minutes) >= MAX_PENDING:
                self.dropped += 1
                return
            m = self.minutes[key] = Minute()
        m.queued_peak = max(m.queued_peak, peak)

    def answered(self, workspace: str, container_id: str, at: dt.datetime) -> None:
        """A container answered a call at `at`: kept when it is the first this gateway saw."""
        key = (workspace, container_id)
        if key in self.seen or key in self.answers:
            return
        if len(self.answers) >= MAX_PENDING:
            self.dropped += 1
            return
        self.answers[key] = at

    def take(self) -> tuple[dict[MinuteKey, Minute], dict[AnswerKey, dt.datetime]]:
        """Everything pending, leaving the meter empty: what a flush writes."""
        minutes, answers = self.minutes, self.answers
        self.minutes, self.answers = {}, {}
        if len(self.seen) + len(answers) > MAX_SEEN:
            self.seen.clear()  # a repeat is harmless (the table keeps the earliest), a leak is not
        self.seen.update(answers)
        return minutes, answers

    def restore(self, minutes: dict[MinuteKey, Minute], answers: dict[AnswerKey, dt.datetime]) -> None:
        """Put back what a failed flush took, merged with what came since (bounded like add)."""
        for key, m in minutes.items():
            mine = self.minutes.get(key)
            if mine is None:
                if len(self.minutes) >= MAX_PENDING:
                    self.dropped += m.calls
                    continue
                self.minutes[key] = m
            else:
                mine.calls, mine.errors = mine.calls + m.calls, mine.errors + m.errors
                mine.counts = add_counts(mine.counts, m.counts)
                mine.queued_peak = max(mine.queued_peak, m.queued_peak)
        for akey, at in answers.items():
            self.seen.discard(akey)
            if akey in self.answers:
                self.answers[akey] = min(at, self.answers[akey])
            elif len(self.answers) < MAX_PENDING:
                self.answers[akey] = at
            else:
                self.dropped += 1
