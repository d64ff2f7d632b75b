"""Projections in Postgres: apply an event and record the stream position in one transaction.

A batch is applied inside one transaction that first takes an advisory lock on (schema, projection),
reads the stored position and skips every event at or below it, so redelivery and replay are
no-ops and two replicas of a service never apply the same event twice. The lock is taken before any
table is touched, which is what lets a rebuild swap schemas underneath a running service.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from abc import ABC, abstractmethod
from typing import Sequence

import asyncpg

from levers9.contracts import Message

from .consumer import Delivery
from .telemetry import PROJECTION_POSITION

IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def ident(name: str) -> str:
    if not IDENT.fullmatch(name):
        raise ValueError(f"{name!r} is not a safe SQL identifier")
    return name


def schema_for(service: str) -> str:
    """A service's Postgres schema: its name with dashes as underscores (`pool_controller`)."""
    return ident(service.replace("-", "_"))


class Projection(ABC):
    """One read model: its tables, the subjects it reads and how one event changes it."""

    name: str = ""
    filter_subjects: Sequence[str] = ()
    tables: Sequence[str] = ()

    @abstractmethod
    def ddl(self, schema: str) -> list[str]:
        """CREATE statements for the tables, in `schema` (idempotent: IF NOT EXISTS)."""

    @abstractmethod
    async def apply(self, conn: asyncpg.Connection, schema: str, msg: Message, seq: int) -> None:
        """Change the tables for one event. Use event data and occurred_at, never now(): a rebuild
        must produce the same rows."""


class BatchedProjection(Projection):
    """A projection whose events become SQL statements: the store sends each run of consecutive
    identical statements as one `executemany` (one round trip instead of one per event), in order,
    so the rows are the same as applying event by event."""

    @abstractmethod
    def statements(self, schema: str, msg: Message, seq: int) -> list[tuple[str, tuple]]:
        """The (sql, args) that apply one event, in order."""

    async def apply(self, conn: asyncpg.Connection, schema: str, msg: Message, seq: int) -> None:
        for sql, args in self.statements(schema, msg, seq):
            await conn.execute(sql, *args)


def lock_key(schema: str, projection: str) -> int:
    digest = hashlib.blake2b(f"{schema}.{projection}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class ProjectionStore:
    """The projections of one service, in its own schema."""

    def __init__(self, pool: asyncpg.Pool, schema: str, projections: Sequence[Projection],
                 lock_schema: str | None = None) -> None:
        self.pool = pool
        self.schema = ident(schema)
        self.lock_schema = lock_schema or schema  # a rebuild writes elsewhere but is keyed like live
        self.projections = list(projections)

    async def setup(self) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            # serialise concurrent setups of the same schema (two replicas starting at once)
            await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key(self.lock_schema, "__setup__"))
            # only when missing: a service's role owns its schema (made for it by `levers9 up`) but
            # may not create schemas, and CREATE SCHEMA IF NOT EXISTS asks for that right first
            if not await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", self.schema):
                await conn.execute(f"CREATE SCHEMA {self.schema}")
            await conn.execute(f"CREATE TABLE IF NOT EXISTS {self.schema}.positions "
                               "(projection text PRIMARY KEY, seq bigint NOT NULL)")
            for p in self.projections:
                for stmt in p.ddl(self.schema):
                    await conn.execute(stmt)

    async def position(self, projection: Projection) -> int:
        seq = await self.pool.fetchval(f"SELECT seq FROM {self.schema}.positions WHERE projection = $1",
                                       projection.name)
        return int(seq or 0)

    async def apply_batch(self, projection: Projection, deliveries: Sequence[Delivery]) -> int:
        """Apply in order what is past the stored position; returns how many were applied."""
        if not deliveries:
            return 0
        applied = 0
        async with self.pool.acquire() as conn, conn.transaction():
            # the lock, and no wait for the WAL flush at commit (safe: rows and position commit
            # together, so a crash can only lose whole trailing batches, read again from the stored
            # position). The position is read in a statement of its own, AFTER the lock is held: in
            # one statement its snapshot would predate the lock wait, and a writer of the same
            # projection in another process (two workers of a node, two replicas) that committed
            # meanwhile would have its batch applied a second time.
            await conn.execute("SELECT pg_advisory_xact_lock($1), set_config('synchronous_commit', 'off', true)",
                               lock_key(self.lock_schema, projection.name))
            pos = await conn.fetchval(f"SELECT seq FROM {self.schema}.positions WHERE projection = $1",
                                      projection.name) or 0
            last = pos
            fresh = [d for d in deliveries if d.seq > pos]  # the rest: already applied (redelivery, replay)
            if fresh:
                last = max(last, max(d.seq for d in fresh))
            todo = [(msg, d.seq) for d in fresh if d.error is None and (msg := d.message) is not None]
            applied = len(todo)
            if isinstance(projection, BatchedProjection):
                ops = [op for msg, seq in todo for op in projection.statements(self.schema, msg, seq)]
                for sql, run in itertools.groupby(ops, key=lambda op: op[0]):
                    await conn.executemany(sql, [args for _, args in run])
            else:
                for msg, seq in todo:
                    await projection.apply(conn, self.schema, msg, seq)
            if last > pos:
                await conn.execute(
                    f"INSERT INTO {self.schema}.positions (projection, seq) VALUES ($1, $2) "
                    "ON CONFLICT (projection) DO UPDATE SET seq = EXCLUDED.seq", projection.name, last)
        PROJECTION_POSITION.labels(f"{self.lock_schema}.{projection.name}").set(last)
        return applied
