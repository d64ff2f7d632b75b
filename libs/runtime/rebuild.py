"""Rebuild a service's projections from sequence 1 into fresh tables, compare, and swap them in.

1. Build every projection of the schema into `<schema>__rebuild`, reading the log from sequence 1.
2. In one transaction holding every projection's advisory lock (the live consumers wait on it
   before touching a table): catch the rebuilt tables up to the live positions, compare table by
   table, rename live -> `<schema>__old`, rebuilt -> live, drop the old one.
Live consumers blocked on the lock then resolve table names afresh and write into the new tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import asyncpg

from .bus import Bus
from .consumer import to_delivery
from .projection import Projection, ProjectionStore, ident, lock_key
from .reader import read


@dataclass
class TableDiff:
    table: str
    live_rows: int
    rebuilt_rows: int
    only_live: int
    only_rebuilt: int

    @property
    def equal(self) -> bool:
        return self.only_live == 0 and self.only_rebuilt == 0


@dataclass
class RebuildReport:
    schema: str
    events_applied: int = 0
    positions: dict[str, int] = field(default_factory=dict)
    tables: list[TableDiff] = field(default_factory=list)
    swapped: bool = False

    @property
    def equal(self) -> bool:
        return all(t.equal for t in self.tables)


async def _replay_into(bus: Bus, store: ProjectionStore, p: Projection, start: int, end: int | None) -> int:
    applied = 0
    async for msgs in read(bus, p.filter_subjects, start_seq=start, end_seq=end):
        applied += await store.apply_batch(p, [to_delivery(m, bus.auth.verifier) for m in msgs])
    return applied


# tables, views and sequences of a schema whose owner is not `owner` (indexes follow their table; a
# sequence owned by a column follows its table, so only free-standing ones are listed)
MISOWNED = """
SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relowner <> (SELECT oid FROM pg_roles WHERE rolname = $2)
  AND (c.relkind IN ('r', 'p', 'v', 'm', 'f')
       OR (c.relkind = 'S' AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype IN ('a', 'i'))))
"""


async def give_schema(conn: asyncpg.Connection, schema: str, owner: str) -> int:
    """`schema` and everything in it to role `owner`; how many tables changed owner."""
    s, o = ident(schema), ident(owner)
    await conn.execute(f"ALTER SCHEMA {s} OWNER TO {o}")
    rows = await conn.fetch(MISOWNED, s, o)
    for row in rows:
        kind = {"S": "SEQUENCE", "v": "VIEW", "m": "MATERIALIZED VIEW", "f": "FOREIGN TABLE"}.get(row["relkind"], "TABLE")
        await conn.execute(f'ALTER {kind} {s}."{row["relname"]}" OWNER TO {o}')
    return len(rows)


async def compare(conn: asyncpg.Connection, live: str, rebuilt: str, table: str) -> TableDiff:
    t = ident(table)
    only_live = await conn.fetchval(
        f"SELECT count(*) FROM (SELECT * FROM {live}.{t} EXCEPT ALL SELECT * FROM {rebuilt}.{t}) d")
    only_rebuilt = await conn.fetchval(
        f"SELECT count(*) FROM (SELECT * FROM {rebuilt}.{t} EXCEPT ALL SELECT * FROM {live}.{t}) d")
    return TableDiff(table, await conn.fetchval(f"SELECT count(*) FROM {live}.{t}"),
                     await conn.fetchval(f"SELECT count(*) FROM {rebuilt}.{t}"), only_live, only_rebuilt)


async def rebuild(bus: Bus, pool: asyncpg.Pool, schema: str, projections: Sequence[Projection], *,
                  swap: bool = True) -> RebuildReport:
    live = ident(schema)
    tmp = ident(f"{schema}__rebuild")
    report = RebuildReport(schema=live)
    await pool.execute(f"DROP SCHEMA IF EXISTS {tmp} CASCADE")
    fresh = ProjectionStore(pool, tmp, projections, lock_schema=f"{live}__rebuild")
    await fresh.setup()
    live_store = ProjectionStore(pool, live, projections)
    await live_store.setup()
    for p in projections:  # the bulk, without holding any lock
        report.events_applied += await _replay_into(bus, fresh, p, 1, None)
    async with pool.acquire() as conn, conn.transaction():
        for p in sorted(projections, key=lambda p: p.name):  # fixed order: no deadlock with consumers
            await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key(live, p.name))
        for p in projections:
            live_pos = int(await conn.fetchval(f"SELECT seq FROM {live}.positions WHERE projection=$1", p.name) or 0)
            built_pos = await fresh.position(p)
            if live_pos > built_pos:  # events the live consumer applied meanwhile
                report.events_applied += await _replay_into(bus, fresh, p, built_pos + 1, live_pos)
            report.positions[p.name] = max(live_pos, await fresh.position(p))
        for p in projections:
            for table in p.tables:
                report.tables.append(await compare(conn, live, tmp, table))
        if swap:
            owner = await conn.fetchval("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = $1", live)
            if owner and owner != await conn.fetchval("SELECT current_user"):
                await give_schema(conn, tmp, owner)
            await conn.execute(f"DROP SCHEMA IF EXISTS {live}__old CASCADE")
            await conn.execute(f"ALTER SCHEMA {live} RENAME TO {live}__old")
            await conn.execute(f"ALTER SCHEMA {tmp} RENAME TO {live}")
            await conn.execute(f"DROP SCHEMA {live}__old CASCADE")
            report.swapped = True
    if not swap:
        await pool.execute(f"DROP SCHEMA IF EXISTS {tmp} CASCADE")
    return report
