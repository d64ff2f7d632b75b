"""The pool controller's time rules, pure: which workers are lost, and for how long each has been idle.

Every function takes the clock as an argument (`now`, seconds since the epoch) and reads nothing else,
so a test moves time by passing a larger number instead of sleeping.

The lost-worker rule, in order:
1. a worker whose process the backend saw exit is lost at once (faster than any heartbeat expiry);
2. a worker still provisioning is lost when it has not registered within `provision_timeout`;
3. a registered or ready worker is lost when its heartbeat is older than `ttl` and it registered more
   than `grace` ago (a new worker gets that long to show its first heartbeat), but only when the
   heartbeat table is known to be current: a table that could not be read says nothing about workers,
   so it never makes one lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

ALIVE = frozenset({"provisioning", "registered", "ready"})

EXITED = "its process exited"
EXITED_BEFORE_REGISTERING = "its process exited before registering"
NEVER_REGISTERED = "never registered"
HEARTBEAT_EXPIRED = "heartbeat expired"
REASONS = frozenset({EXITED, EXITED_BEFORE_REGISTERING, NEVER_REGISTERED, HEARTBEAT_EXPIRED})


@dataclass(frozen=True)
class WorkerState:
    """What the lost-worker rule needs to know about one worker, from the projection and this process."""
    worker_id: str
    status: str  # provisioning | registered | ready | lost | drained
    since: float  # when it reached that status (the event's time)
    provisioning_since: float | None = None  # when this controller first saw it provisioning


@dataclass(frozen=True)
class Heartbeats:
    """The heartbeat table: when each worker's latest heartbeat was seen, and whether the table is
    current (its watcher is connected and has read what the bucket held). Not current: unknown."""
    seen: Mapping[str, float] = field(default_factory=dict)
    current: bool = False

    def fresh(self, worker_id: str, now: float, ttl: float) -> bool:
        at = self.seen.get(worker_id)
        return at is not None and now - at <= ttl


def lost_workers(workers: Iterable[WorkerState], heartbeats: Heartbeats, now: float, ttl: float, grace: float, *,
                 exited: frozenset[str] = frozenset(), provision_timeout: float = 120.0) -> list[tuple[str, str]]:
    """(worker_id, reason) of every worker to declare lost now, in the order given."""
    out = []
    for w in workers:
        reason = _lost_reason(w, heartbeats, now, ttl, grace, exited, provision_timeout)
        if reason:
            out.append((w.worker_id, reason))
    return out


def _lost_reason(w: WorkerState, heartbeats: Heartbeats, now: float, ttl: float, grace: float,
                 exited: frozenset[str], provision_timeout: float) -> str:
    if w.status not in ALIVE:
        return ""
    if w.status == "provisioning":
        if w.worker_id in exited:
            return EXITED_BEFORE_REGISTERING
        started = w.since if w.provisioning_since is None else w.provisioning_since
        return NEVER_REGISTERED if now - started > provision_timeout else ""
    if w.worker_id in exited:
        return EXITED
    if not heartbeats.current or heartbeats.fresh(w.worker_id, now, ttl) or now - w.since <= grace:
        return ""
    return HEARTBEAT_EXPIRED


# ---- idle workers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerLoad:
    worker_id: str
    status: str
    busy: bool  # has containers


def idle_since(previous: Mapping[str, float], workers: Iterable[WorkerLoad], now: float) -> dict[str, float]:
    """When each worker became idle: a ready worker without containers keeps the time it was first seen
    so; a busy or not-ready one is not idle (absent), and workers no longer listed are forgotten."""
    return {w.worker_id: previous.get(w.worker_id, now) for w in workers if w.status == "ready" and not w.busy}


def idle_for(since: Mapping[str, float], worker_id: str, now: float) -> float:
    """Seconds `worker_id` has been idle (0 when it is not idle)."""
    at = since.get(worker_id)
    return 0.0 if at is None else max(0.0, now - at)
