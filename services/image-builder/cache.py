"""The layer cache records: which step hashes have a cache tag in the registry, projected from the
builds' events (ImagePushed lists the steps whose tags exist now; ImageBuildStarted marks the steps
it reuses as used). A build starts after the deepest step whose hash is here and every step's before.

The cache is the platform's, not a workspace's: a step's hash covers its text and everything before
it, so the same hash is the same layer whoever asked for it.
"""

from __future__ import annotations

from typing import Iterable

import asyncpg

from levers9.contracts import Message, subjects
from levers9.contracts import events as E
from levers9.contracts.images import CACHE_REPOSITORY
from levers9.runtime.projection import Projection
from levers9.runtime.views import occurred


class LayerCacheView(Projection):
    name = "layers"
    filter_subjects = (subjects.filter_subject(aggregate="image", event_type="ImagePushed"),
                       subjects.filter_subject(aggregate="image", event_type="ImageBuildStarted"))
    tables = ("layers",)

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.layers (
            step_hash text PRIMARY KEY, registry text NOT NULL, reference text NOT NULL, image_id text NOT NULL,
            workspace text NOT NULL, created_at timestamptz NOT NULL, last_used_at timestamptz NOT NULL,
            uses int NOT NULL DEFAULT 0)"""]

    async def apply(self, conn: asyncpg.Connection, schema: str, msg: Message, seq: int) -> None:
        ev, at = msg.event, occurred(msg)
        if isinstance(ev, E.ImagePushed):
            await conn.executemany(
                f"""INSERT INTO {schema}.layers (step_hash, registry, reference, image_id, workspace, created_at,
                        last_used_at) VALUES ($1, $2, $3, $4, $5, $6, $6)
                    ON CONFLICT (step_hash) DO UPDATE SET registry=$2, reference=$3, last_used_at=$6""",
                [(h, ev.registry, f"{CACHE_REPOSITORY}:{h}", ev.image_id, msg.envelope.workspace, at)
                 for h in ev.step_hashes])
        elif isinstance(ev, E.ImageBuildStarted) and ev.cached_steps:
            await conn.execute(f"""UPDATE {schema}.layers SET last_used_at=$2, uses=uses + 1
                                   WHERE step_hash = ANY($1)""", [s.hash for s in ev.steps[:ev.cached_steps]], at)


async def cached_hashes(pool: asyncpg.Pool, schema: str, hashes: Iterable[str]) -> set[str]:
    """Which of these step hashes the cache holds."""
    rows = await pool.fetch(f"SELECT step_hash FROM {schema}.layers WHERE step_hash = ANY($1)", list(set(hashes)))
    return {r["step_hash"] for r in rows}
