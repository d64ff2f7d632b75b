"""A workspace's events as they are appended, straight from JetStream: the live half of the event API.

One ordered consumer per stream on two filters, the workspace's subjects and the workers' (`_sys`),
so events arrive in stream order whatever their subject: a client that resumes from the last
sequence it saw misses nothing. nats-py's ordered consumer re-creates itself from the last sequence
it delivered when it sees a gap or misses heartbeats; before its first message that sequence is 0,
so it would replay the whole log: the cursor below drops anything at or before what was already
sent (nothing twice). Its buffer is bounded (pending_msgs_limit) and flow control waits on the
reader, so a slow client slows only its own consumer. Each event goes through the same rules as
the list (event_rules): nothing of another workspace.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

import nats.errors
from nats.js.api import ConsumerConfig, DeliverPolicy

from levers9.contracts import SYSTEM_WORKSPACE, ContractError, check_workspace, decode, subjects

from .event_rules import CLUSTER_PREFIX, EVERYONE, audience, event_json, readable
from .state import Gateway as GatewayState

log = logging.getLogger("levers9.gateway.events")

KEEPALIVE_S = 15.0
CLUSTERS_REFRESH_S = 30.0  # how stale the caller's own clusters (and shares) may be in a stream
BUFFER_MSGS = 1000  # per stream, client side; past it the server waits (flow control)


async def clusters_of(gw: GatewayState, workspace: str) -> frozenset[str]:
    """The attached clusters a workspace owns or was shared (their workers' events are its to read)."""
    rows = await gw.pool.fetch("SELECT name FROM gateway.clusters WHERE workspace = $1 AND NOT detached "
                               "UNION SELECT name FROM gateway.cluster_shares WHERE workspace = $1", workspace)
    return frozenset(r["name"] for r in rows)


class Follower:
    """One client's live events, after `after` (None: only those appended from now on)."""

    def __init__(self, gw: GatewayState, workspace: str, after: int | None) -> None:
        self.gw, self.workspace, self.after = gw, workspace, after
        self.clusters: frozenset[str] = frozenset()
        self.clusters_at = 0.0
        self.worker_cluster: dict[str, str] = {}  # worker id -> its attached cluster ("" : the platform's)

    async def subscribe(self) -> Any:
        js = self.gw.bus.js
        if self.after is None:  # from now on: the stream's end now, so a reset can name where it was
            self.after = (await js.stream_info(subjects.STREAM)).state.last_seq
        mine = f"{subjects.ROOT}.{check_workspace(self.workspace)}.>"
        workers = f"{subjects.ROOT}.{SYSTEM_WORKSPACE}.worker.>"
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.after + 1,
                                filter_subjects=[mine, workers])
        return await js.subscribe(mine, stream=subjects.STREAM, ordered_consumer=True, config=config,
                                  pending_msgs_limit=BUFFER_MSGS, pending_bytes_limit=64 << 20)

    async def events(self) -> AsyncIterator[dict[str, Any] | None]:
        """Each readable event in stream order; None after KEEPALIVE_S without one (send a keepalive)."""
        sub = await self.subscribe()
        last = self.after or 0
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=KEEPALIVE_S)
                except (nats.errors.TimeoutError, asyncio.TimeoutError):
                    yield None
                    continue
                seq = msg.metadata.sequence.stream
                if seq <= last:  # a reset replayed it: sent already
                    continue
                last = seq
                event = await self.readable_event(seq, msg.subject, msg.data)
                if event is not None:
                    yield event
        finally:
            try:
                await sub.unsubscribe()
            except (nats.errors.Error, OSError, ValueError) as exc:  # the connection is gone: nothing to release
                log.debug("unsubscribe: %r", exc)

    async def readable_event(self, seq: int, subject: str, payload: bytes) -> dict[str, Any] | None:
        try:
            msg = decode(payload, subject)
        except ContractError:  # the DLQ has it; a reader cannot use it
            return None
        event = event_json(seq, msg)
        cluster = ""
        if event["aggregate"] == "worker":
            cluster = await self.cluster_of(event["aggregate_id"], event["type"], event["data"])
        who = audience(event["workspace"], event["aggregate"], event["type"], event["data"], cluster)
        if who.startswith(CLUSTER_PREFIX) and time.monotonic() - self.clusters_at > CLUSTERS_REFRESH_S:
            self.clusters, self.clusters_at = await clusters_of(self.gw, self.workspace), time.monotonic()
        return event if readable(who, self.workspace, self.clusters) else None

    async def cluster_of(self, worker_id: str, event_type: str, data: dict[str, Any]) -> str:
        """The attached cluster a worker runs on: from its WorkerProvisioned when this stream saw it,
        else from the index (its provisioning is long past), remembered for the stream's life."""
        if event_type == "WorkerProvisioned":
            self.worker_cluster[worker_id] = str(data.get("cluster", ""))
        if worker_id not in self.worker_cluster:
            found = await self.gw.pool.fetchval(
                "SELECT audience FROM gateway.events WHERE type = 'WorkerProvisioned' AND aggregate_id = $1 "
                "ORDER BY seq DESC LIMIT 1", worker_id)
            cluster = found[len(CLUSTER_PREFIX):] if found and found != EVERYONE else ""
            self.worker_cluster[worker_id] = cluster
        return self.worker_cluster[worker_id]
