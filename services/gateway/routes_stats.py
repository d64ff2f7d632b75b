"""`GET /api/v1/deployments/{name}/stats?minutes=60`: a deployment's calls per minute, their latency,
and its cold starts split by how they started, over the last `minutes` (1..1440).

Every figure is derived from the log (through the gateway's projections), so every replica answers
the same, and each says what it measures (NOTES, sent with the answer):
- calls: the deployment's function calls that ended in that minute (FunctionCallFinished, any
  version of the deployment), their p50/p99 duration over all attempts (the gateway's clock, from
  taking the call to its result), plus its endpoint (HTTP) calls answered in that minute. Those are in
  no event: the gateways meter them (endpoint_meter.py) into gateway.endpoint_minutes, latency as
  bucket counts, so a minute with endpoint calls has its p50/p99 from buckets (all its calls'), one
  without them the exact values.
- cold starts: its containers that became ready in the window, with the time from ContainerRequested
  to ContainerReady, and their kind: "restored" (the deployment's own checkpoint), "shared
  checkpoint" (a catalogue's pre-import checkpoint) or "cold".
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Iterable

from fastapi import APIRouter, HTTPException

from .auth import User
from .deps import Gateway
from .endpoint_meter import add_counts, bucket_percentile, histogram

router = APIRouter()

MAX_MINUTES = 1440
NOTES = {
    "calls": "function calls of this deployment that ended in the minute (FunctionCallFinished, retries "
             "excluded) plus endpoint (HTTP) calls the gateways proxied and answered in the minute "
             "(metered in memory, written every few seconds: the last seconds may be missing)",
    "errors": "function calls that did not end ok, and endpoint calls answered 5xx (the container's or the "
              "gateway's own: no capacity, failed start, no answer)",
    "p50_ms/p99_ms": "function calls: duration over all attempts, measured by the gateway; endpoint calls: "
                     "from the request reaching the gateway to the answer's head leaving it. A minute with "
                     "endpoint calls gives them from latency buckets (within about 25 %), one without the exact "
                     "values (null: no call)",
    "queued_peak": "the most calls (endpoint and function) that waited at once for a container of the deployment in "
                   "the minute, sampled every few seconds by each gateway (with several gateways, the greatest)",
    "cold_starts": "containers that became ready in the window: ms from ContainerRequested to ContainerReady",
    "kind": "restored: from the deployment's own checkpoint; shared checkpoint: from a catalogue's; cold: no restore",
}


def cold_kind(restored_from: str, own: frozenset[str]) -> str:
    if not restored_from:
        return "cold"
    return "restored" if restored_from in own else "shared checkpoint"


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (q in 0..1) of the values; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 1))  # ceil(n q), at least the first
    return ordered[int(rank) - 1]


# minute, calls, errors (5xx), latency bucket counts, the most calls waiting at once
EndpointMinute = tuple[dt.datetime, int, int, list[int], int]


def minute_series(until: dt.datetime, minutes: int, calls: Iterable[tuple[dt.datetime, str, float]],
                  endpoint: Iterable[EndpointMinute] = ()) -> list[dict]:
    """One entry per minute of the window, oldest first, zero-filled: (ended at, outcome, ms) per function
    call and the endpoint meter's minutes (several rows of one minute add up: one per deployment version)."""
    end = until.replace(second=0, microsecond=0)
    start = end - dt.timedelta(minutes=minutes - 1)
    buckets: dict[dt.datetime, list[tuple[str, float]]] = {start + dt.timedelta(minutes=i): [] for i in range(minutes)}
    for at, outcome, ms in calls:
        key = at.replace(second=0, microsecond=0)
        if key in buckets:
            buckets[key].append((outcome, ms))
    metered: dict[dt.datetime, tuple[int, int, list[int], int]] = {}
    for at, n, errors, counts, queued in endpoint:
        key = at.replace(second=0, microsecond=0)
        if key in buckets:
            had = metered.get(key, (0, 0, [], 0))
            metered[key] = (had[0] + n, had[1] + errors, add_counts(had[2], list(counts)), max(had[3], queued))
    return [minute_entry(minute, items, metered.get(minute)) for minute, items in buckets.items()]


def minute_entry(minute: dt.datetime, items: list[tuple[str, float]],
                 metered: tuple[int, int, list[int], int] | None) -> dict[str, Any]:
    durations = [ms for _, ms in items]
    calls, errors = len(items), sum(1 for o, _ in items if o != "ok")
    p50, p99 = percentile(durations, 0.5), percentile(durations, 0.99)
    if metered is not None and metered[0]:
        # endpoint latencies are only bucket counts: the function calls join them in the same buckets
        counts = add_counts(metered[2], histogram(durations))
        calls, errors = calls + metered[0], errors + metered[1]
        p50, p99 = bucket_percentile(counts, 0.5), bucket_percentile(counts, 0.99)
    return {"minute": iso(minute), "calls": calls, "errors": errors, "p50_ms": p50, "p99_ms": p99,
            "queued_peak": metered[3] if metered is not None else 0}


def cold_summary(starts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for kind in ("restored", "shared checkpoint", "cold"):
        times = [s["ms"] for s in starts if s["kind"] == kind]
        out[kind] = {"count": len(times), "p50_ms": percentile(times, 0.5), "max_ms": max(times) if times else None}
    return out


def iso(at: dt.datetime) -> str:
    return at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@router.get("/api/v1/deployments/{name}/stats")
async def deployment_stats(name: str, caller: User, gw: Gateway, minutes: str = "60") -> dict[str, Any]:
    if not minutes.isdigit() or not 1 <= int(minutes) <= MAX_MINUTES:
        raise HTTPException(422, f"minutes must be a whole number from 1 to {MAX_MINUTES}, not {minutes[:20]!r}")
    window = int(minutes)
    ids = [r["deployment_id"] for r in await gw.pool.fetch(
        "SELECT deployment_id FROM gateway.deployments WHERE workspace = $1 AND name = $2", caller.workspace, name)]
    if not ids:
        raise HTTPException(404, f"no deployment {name[:80]!r} in this workspace: see `levers9 deployments list`")
    until = dt.datetime.now(dt.timezone.utc)
    since = until.replace(second=0, microsecond=0) - dt.timedelta(minutes=window - 1)
    calls = await gw.pool.fetch(
        "SELECT finished_at, state, duration_ms FROM gateway.function_calls WHERE workspace = $1 "
        "AND deployment_id = ANY($2::text[]) AND finished_at >= $3", caller.workspace, ids, since)
    endpoint = await gw.pool.fetch(
        "SELECT minute, calls, errors, buckets, queued_peak FROM gateway.endpoint_minutes WHERE workspace = $1 "
        "AND deployment_id = ANY($2::text[]) AND minute >= $3", caller.workspace, ids, since)
    own = frozenset(r["checkpoint_id"] for r in await gw.pool.fetch(
        "SELECT checkpoint_id FROM gateway.checkpoints WHERE workspace = $1 AND deployment_id = ANY($2::text[])",
        caller.workspace, ids))
    rows = await gw.pool.fetch(
        "SELECT container_id, deployment_id, restored_from, requested_at, ready_at FROM gateway.containers "
        "WHERE workspace = $1 AND deployment_id = ANY($2::text[]) AND ready_at >= $3 AND requested_at IS NOT NULL "
        "ORDER BY ready_at", caller.workspace, ids, since)
    starts = [{"container_id": r["container_id"], "deployment_id": r["deployment_id"],
               "kind": cold_kind(r["restored_from"], own), "requested_at": iso(r["requested_at"]),
               "ready_at": iso(r["ready_at"]),
               "ms": round((r["ready_at"] - r["requested_at"]).total_seconds() * 1000, 1)} for r in rows]
    return {"deployment": name, "minutes": window, "since": iso(since), "until": iso(until),
            "calls": minute_series(until, window, ((r["finished_at"], r["state"], r["duration_ms"]) for r in calls),
                                   ((r["minute"], r["calls"], r["errors"], r["buckets"], r["queued_peak"])
                                    for r in endpoint)),
            "cold_starts": starts, "cold_start_summary": cold_summary(starts), "notes": NOTES}
