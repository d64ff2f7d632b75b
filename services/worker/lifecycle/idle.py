"""The keep-warm rule (pure): when a ready container has been idle long enough to stop (scale to zero).

The clock is an argument: tests and callers pass `now`, nothing here reads the time.
"""

from __future__ import annotations


def idle_since(ready_at: float, last_request_at: float | None) -> float:
    """When the container's idle time started: its last request, but never before this container's
    own ready time (a restored runner remembers the requests of the container it was dumped from,
    which may be long ago)."""
    return max(last_request_at or 0.0, ready_at)


def should_stop_idle(now: float, ready_at: float, last_request_at: float | None, inflight: int,
                     keep_warm_seconds: float) -> str | None:
    """Why the container should stop now, or None while it must stay: it serves no request and
    none came for `keep_warm_seconds` (counted from its ready time at the earliest)."""
    if inflight > 0:
        return None
    if now - idle_since(ready_at, last_request_at) < keep_warm_seconds:
        return None
    return f"idle for {keep_warm_seconds:g} s (scale to zero)"
