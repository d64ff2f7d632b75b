"""Attached clusters (ClusterAttached / ClusterShared / ClusterDetached) and the workers provisioned
on them (WorkerProvisioned with a cluster): who owns each cluster, whom it is shared with, which
workers run there. The gateway lists and authorizes from it; the scheduler recovers from it which
workspaces may use which worker (scheduler.recovery). Rows are keyed by the cluster's reference
`WORKSPACE/NAME` (events.cluster.cluster_ref): names are each workspace's own."""

from __future__ import annotations

import asyncpg

from levers9.contracts import SYSTEM_WORKSPACE, Message, subjects
from levers9.contracts import events as E
from levers9.contracts.events.cluster import ClusterAttached, ClusterDetached, ClusterShared, cluster_ref

from .projection import Projection
from .views import occurred


class ClustersView(Projection):
    name = "clusters"
    filter_subjects = (subjects.filter_subject(aggregate="cluster"),
                       subjects.filter_subject(workspace=SYSTEM_WORKSPACE, aggregate="worker",
                                               event_type="WorkerProvisioned"))
    tables = ("clusters", "cluster_shares", "cluster_workers")

    def ddl(self, schema: str) -> list[str]:
        return [f"""CREATE TABLE IF NOT EXISTS {schema}.clusters (
            name text PRIMARY KEY, workspace text NOT NULL, token_id text NOT NULL DEFAULT '',
            attached_at timestamptz NOT NULL, detached boolean NOT NULL DEFAULT false)""",
                f"""CREATE TABLE IF NOT EXISTS {schema}.cluster_shares (
            name text NOT NULL, workspace text NOT NULL, shared_at timestamptz NOT NULL,
            PRIMARY KEY (name, workspace))""",
                f"""CREATE TABLE IF NOT EXISTS {schema}.cluster_workers (
            worker_id text PRIMARY KEY, cluster text NOT NULL)"""]

    async def apply(self, conn: asyncpg.Connection, schema: str, msg: Message, seq: int) -> None:
        ev, owner = msg.event, msg.envelope.workspace
        ref = cluster_ref(owner, getattr(ev, "name", ""))
        if isinstance(ev, ClusterAttached):
            await conn.execute(f"""INSERT INTO {schema}.clusters VALUES ($1,$2,$3,$4,false) ON CONFLICT (name)
                                   DO UPDATE SET token_id=$3, attached_at=$4, detached=false
                                   WHERE {schema}.clusters.workspace=$2""", ref, owner, ev.token_id, occurred(msg))
        elif isinstance(ev, ClusterShared):
            await conn.execute(f"""INSERT INTO {schema}.cluster_shares SELECT $1, $2, $3 WHERE EXISTS
                                   (SELECT 1 FROM {schema}.clusters WHERE name=$1 AND workspace=$4)
                                   ON CONFLICT DO NOTHING""", ref, ev.workspace, occurred(msg), owner)
        elif isinstance(ev, ClusterDetached):
            if await conn.fetchval(f"UPDATE {schema}.clusters SET detached = true WHERE name=$1 AND workspace=$2 "
                                   "RETURNING 1", ref, owner):
                await conn.execute(f"DELETE FROM {schema}.cluster_shares WHERE name=$1", ref)
        elif isinstance(ev, E.WorkerProvisioned) and ev.cluster:
            await conn.execute(f"INSERT INTO {schema}.cluster_workers VALUES ($1,$2) ON CONFLICT DO NOTHING",
                               ev.worker_id, ev.cluster)
