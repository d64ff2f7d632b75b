"""The volumes of every workspace (VolumeCreated / VolumeDeleted): which names exist, since when."""

from __future__ import annotations

import asyncpg

from levers9.contracts import Message, subjects
from levers9.contracts.events.volume import VolumeCreated, VolumeDeleted

from .projection import Projection
from .views import occurred


class VolumesView(Projection):
    name = "volumes"
    filter_subjects = (subjects.filter_subject(aggregate="volume"),)
    tables = ("volumes",)

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.volumes (
            workspace text NOT NULL, name text NOT NULL, created_at timestamptz NOT NULL,
            PRIMARY KEY (workspace, name))"""]

    async def apply(self, conn: asyncpg.Connection, schema: str, msg: Message, seq: int) -> None:
        ev = msg.event
        if isinstance(ev, VolumeCreated):
            await conn.execute(f"INSERT INTO {schema}.volumes VALUES ($1,$2,$3) ON CONFLICT DO NOTHING",
                               msg.envelope.workspace, ev.name, occurred(msg))
        elif isinstance(ev, VolumeDeleted):
            await conn.execute(f"DELETE FROM {schema}.volumes WHERE workspace=$1 AND name=$2",
                               msg.envelope.workspace, ev.name)
