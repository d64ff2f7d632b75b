"""PROTOTYPES of proposed library changes, used only by `bench_projection.py --variant proposed` and
`bench_replay.py --variant proposed` to show what the changes would buy. They are NOT the library:
the figures of record are the default `--variant library` runs. Each class says which library
function it stands in for.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Sequence

import asyncpg
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from levers9.contracts import Message, subjects
from levers9.contracts import events as E
from levers9.runtime.bus import Bus
from levers9.runtime.consumer import Delivery
from levers9.runtime.projection import Projection, ProjectionStore, lock_key
from levers9.runtime.telemetry import PROJECTION_POSITION
from levers9.runtime.views import ContainersView, occurred


class BatchedContainersView(ContainersView):
    """ContainersView with `apply_many`: a run of consecutive ContainerRequested events is written with
    one `executemany` (asyncpg pipelines it: one round trip for the run instead of one per event).
    Same statement, same order, so the same rows; other event types fall back to `apply`."""

    async def apply_many(self, conn: asyncpg.Connection, schema: str, msgs: Sequence[tuple[Message, int]]) -> None:
        run: list[tuple] = []
        sql = None
        for msg, seq in msgs:
            ev, env = msg.event, msg.envelope
            if isinstance(ev, E.ContainerRequested):
                run.append((env.workspace, ev.container_id, ev.deployment_id, ev.cpu_millicores, ev.memory_mib,
                            list(ev.gpu), ev.gpu_count, ev.pool, ev.checkpoint_id, occurred(msg), env.correlation_id))
                continue
            if run:
                await conn.executemany(sql or (sql := self._requested_sql(schema)), run)
                run = []
            await self.apply(conn, schema, msg, seq)
        if run:
            await conn.executemany(sql or self._requested_sql(schema), run)

    @staticmethod
    def _requested_sql(schema: str) -> str:  # the statement of ContainersView.apply, verbatim
        return f"""INSERT INTO {schema}.containers (workspace, container_id, deployment_id, status, cpu_millicores,
                    memory_mib, gpu, gpu_count, pool, checkpoint_id, requested_at, updated_at, correlation_id, version)
                    VALUES ($1,$2,$3,'requested',$4,$5,$6,$7,$8,$9,$10,$10,$11,1)
                    ON CONFLICT (workspace, container_id) DO UPDATE SET status='requested', worker_id='',
                    address='', reason='', exit_code=NULL, deployment_id=EXCLUDED.deployment_id,
                    cpu_millicores=EXCLUDED.cpu_millicores, memory_mib=EXCLUDED.memory_mib, gpu=EXCLUDED.gpu,
                    gpu_count=EXCLUDED.gpu_count, pool=EXCLUDED.pool, checkpoint_id=EXCLUDED.checkpoint_id,
                    requested_at=COALESCE({schema}.containers.requested_at, EXCLUDED.requested_at),
                    updated_at=EXCLUDED.updated_at, correlation_id=EXCLUDED.correlation_id,
                    version={schema}.containers.version + 1"""


class BatchedStore(ProjectionStore):
    """Stands in for ProjectionStore.apply_batch: same transaction, same advisory lock, same skip of
    what is at or below the stored position, but
      - the lock and the position read are one statement (one round trip instead of two);
      - the projection gets the whole batch (`apply_many`, executemany) instead of one call per event;
      - optionally `synchronous_commit = off` for this transaction only (set_config(..., true) in the
        same statement): safe here because the rows and the position commit together, so a crash can
        only lose a suffix of whole batches, which the consumer re-reads from the stored position.
    """

    def __init__(self, pool: asyncpg.Pool, schema: str, projections: Sequence[Projection],
                 sync_commit: bool = True) -> None:
        super().__init__(pool, schema, projections)
        self.sync_commit = sync_commit

    async def apply_batch(self, projection: Projection, deliveries: Sequence[Delivery]) -> int:
        if not deliveries:
            return 0
        s = self.schema
        async with self.pool.acquire() as conn, conn.transaction():
            pos = await conn.fetchval(
                f"SELECT set_config('synchronous_commit', $3, true), pg_advisory_xact_lock($1), "
                f"(SELECT seq FROM {s}.positions WHERE projection = $2)",
                lock_key(self.lock_schema, projection.name), projection.name,
                "on" if self.sync_commit else "off", column=2) or 0
            todo = [d for d in deliveries if d.seq > pos]
            if not todo:
                return 0
            msgs = [(d.message, d.seq) for d in todo if d.error is None and d.message is not None]
            await projection.apply_many(conn, s, msgs)  # type: ignore[attr-defined]
            last = max(d.seq for d in todo)
            await conn.execute(f"INSERT INTO {s}.positions (projection, seq) VALUES ($1, $2) "
                               "ON CONFLICT (projection) DO UPDATE SET seq = EXCLUDED.seq", projection.name, last)
        PROJECTION_POSITION.labels(f"{self.lock_schema}.{projection.name}").set(last)
        return len(msgs)


async def read_push(bus: Bus, filters: Sequence[str] = (f"{subjects.ROOT}.>",), *, start_seq: int = 1,
                    end_seq: int | None = None, batch: int = 2000,
                    stream: str = subjects.STREAM) -> AsyncIterator[list[Msg]]:
    """Stands in for levers9.runtime.reader.read: the same batches in the same order, but from an
    ordered PUSH consumer whose messages arrive in a callback, instead of a pull consumer's `fetch()`.
    nats-py's fetch() waits for each message with asyncio.wait_for (a task and a timer per message);
    the callback path has none of that. Flow control and gap detection are nats-py's ordered consumer's.
    The end: the stream's last sequence now, or the reply subject's pending count reaching 0."""
    if end_seq is None:
        end_seq = (await bus.js.stream_info(stream)).state.last_seq
    if start_seq > end_seq:
        return
    filters = list(filters)
    if len(filters) != 1:
        raise ValueError("the prototype takes one filter subject (all the CLI uses)")
    queue: asyncio.Queue[list[Msg] | None] = asyncio.Queue()
    pending: list[Msg] = []
    finished = False

    async def on_msg(m: Msg) -> None:
        nonlocal finished
        if finished:
            return
        # the reply subject carries the stream sequence and how many are pending after this one
        tokens = m.reply.split(".")
        if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>
            seq, left = int(tokens[5]), tokens[8]
        else:  # the v2 form, with domain and account hash
            seq, left = int(tokens[Msg.Ack.StreamSeq]), tokens[Msg.Ack.NumPending]
        if seq <= end_seq:
            pending.append(m)
        if seq >= end_seq or left == "0":
            finished = True
        if finished or len(pending) >= batch:
            queue.put_nowait(pending[:])
            pending.clear()
            if finished:
                queue.put_nowait(None)

    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start_seq),
                            mem_storage=True)
    sub = await bus.js.subscribe(filters[0], ordered_consumer=True, cb=on_msg, config=config,
                                 pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
    try:
        info = await sub.consumer_info()
        if info.num_pending == 0 and info.delivered.consumer_seq == 0:
            return  # nothing matches
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), timeout=5.0)
            except asyncio.TimeoutError:  # nothing for 5 s: the server has nothing more for us
                if pending:
                    yield pending[:]
                return
            if item is None:
                return
            if item:
                yield item
    finally:
        await sub.unsubscribe()
