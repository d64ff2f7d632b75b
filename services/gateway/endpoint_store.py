"""Where the endpoint meter (endpoint_meter.py) is written: two gateway tables, flushed every FLUSH_S
seconds and once more when the gateway stops, off the calls' path.

- gateway.endpoint_minutes: calls, 5xx errors and latency bucket counts per (workspace, deployment,
  minute). An upsert adds to what is there, so every replica's flushes and a restarted gateway's sum up.
  Its queued_peak (the most calls that waited at once, sampled from the routers before each flush) is
  the greatest of any replica's: with several replicas a lower bound of the deployment's true peak.
- gateway.container_first_answers: when a container first answered a proxied call (the dashboard's
  "first answer" in the start waterfall). Replicas race: the earliest time is kept.

These are measurements, not projections of the log: a rebuild of the gateway's projections leaves them
alone (they are created here, not by a Projection's ddl) and they cannot be rebuilt from the log.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import asyncpg
from prometheus_client import Counter

from .endpoint_meter import EndpointMeter

log = logging.getLogger("levers9.gateway.meter")

FLUSH_S = 5.0
DROPPED = Counter("levers9_gateway_endpoint_meter_dropped_total",
                  "Endpoint calls and first answers not metered: the meter's buffer was full")
FLUSH_FAILURES = Counter("levers9_gateway_endpoint_meter_flush_failures_total",
                         "Flushes of the endpoint meter that failed (kept for the next one)")

DDL = [
    """CREATE TABLE IF NOT EXISTS gateway.endpoint_minutes (
        workspace text NOT NULL, deployment_id text NOT NULL, minute timestamptz NOT NULL,
        calls int NOT NULL, errors int NOT NULL, buckets int[] NOT NULL,
        PRIMARY KEY (workspace, deployment_id, minute))""",
    """CREATE TABLE IF NOT EXISTS gateway.container_first_answers (
        workspace text NOT NULL, container_id text NOT NULL, at timestamptz NOT NULL,
        PRIMARY KEY (workspace, container_id))""",
    # the queue-depth sample (added after the table first shipped: an older table gets the column)
    "ALTER TABLE gateway.endpoint_minutes ADD COLUMN IF NOT EXISTS queued_peak int NOT NULL DEFAULT 0",
]

# bucket arrays of different lengths (bounds appended by a later version) add as if zero-padded
UPSERT_MINUTE = """
    INSERT INTO gateway.endpoint_minutes AS t (workspace, deployment_id, minute, calls, errors, buckets, queued_peak)
    VALUES ($1, $2, $3, $4, $5, $6::int[], $7)
    ON CONFLICT (workspace, deployment_id, minute) DO UPDATE SET
        calls = t.calls + EXCLUDED.calls, errors = t.errors + EXCLUDED.errors,
        queued_peak = GREATEST(t.queued_peak, EXCLUDED.queued_peak),
        buckets = (SELECT array_agg(COALESCE(a, 0) + COALESCE(b, 0) ORDER BY i)
                   FROM unnest(t.buckets, EXCLUDED.buckets) WITH ORDINALITY AS u(a, b, i))"""
# insert-or-nothing, except that an earlier time (another replica's, flushed later) wins
UPSERT_ANSWER = """
    INSERT INTO gateway.container_first_answers AS t (workspace, container_id, at) VALUES ($1, $2, $3)
    ON CONFLICT (workspace, container_id) DO UPDATE SET at = EXCLUDED.at WHERE EXCLUDED.at < t.at"""


async def setup(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        for stmt in DDL:
            await conn.execute(stmt)


async def flush(pool: asyncpg.Pool, meter: EndpointMeter) -> bool:
    """Write what the meter holds; on failure put it back for the next flush. False when it failed."""
    dropped, meter.dropped = meter.dropped, 0
    DROPPED.inc(dropped)
    minutes, answers = meter.take()
    if not minutes and not answers:
        return True
    rows: list[tuple[Any, ...]] = [(ws, dep, minute, m.calls, m.errors, m.counts, m.queued_peak)
                                   for (ws, dep, minute), m in sorted(minutes.items())]
    try:
        async with pool.acquire() as conn, conn.transaction():
            # sorted keys: two replicas flushing the same minutes lock their rows in the same order
            if rows:
                await conn.executemany(UPSERT_MINUTE, rows)
            if answers:
                await conn.executemany(UPSERT_ANSWER, [(ws, cid, at) for (ws, cid), at in sorted(answers.items())])
    except Exception as exc:  # noqa: BLE001 - the meter never fails the gateway: keep the counts, try again
        FLUSH_FAILURES.inc()
        log.warning("endpoint meter: the flush failed (%s: %s); kept for the next one", type(exc).__name__, exc)
        meter.restore(minutes, answers)
        return False
    return True


async def run(pool: asyncpg.Pool, meter: EndpointMeter, stop: asyncio.Event, every: float = FLUSH_S,
              sample: Callable[[], None] = lambda: None) -> None:
    """Flush every `every` seconds until `stop`, then once more; `sample` adds the queue-depth peaks first."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=every)
        except asyncio.TimeoutError:
            pass
        sample()
        await flush(pool, meter)
