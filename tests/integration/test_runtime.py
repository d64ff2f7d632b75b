"""The runtime against real NATS JetStream and PostgreSQL: publish, append, consumers, dead letters,
projections, rebuild. Each test works in its own workspace (subjects) and its own schema (tables)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import nats
import pytest
from nats.js.errors import NotFoundError

from levers9.contracts import Message, envelope, subjects, uuid7
from levers9.contracts import events as E
from levers9.runtime.bus import Bus, ConcurrencyConflict
from levers9.runtime.consumer import OrderedConsumer, WorkConsumer
from levers9.runtime.projection import Projection, ProjectionStore
from levers9.runtime.rebuild import rebuild
from levers9.stack import free_port


def new_ws() -> str:
    return "t" + uuid7().replace("-", "")[-12:]


class Counting(Projection):
    """Counts events per container; `fail` decides, per event, to raise (to test retries)."""
    name = "counting"
    tables = ("counts",)

    def __init__(self, ws: str, fail=None) -> None:
        self.filter_subjects = (f"levers9.{ws}.container.>",)
        self.fail = fail or (lambda msg, seq: None)

    def ddl(self, schema: str) -> list[str]:
        return [f"CREATE TABLE IF NOT EXISTS {schema}.counts (container_id text PRIMARY KEY, n int NOT NULL, "
                "last_type text NOT NULL)"]

    async def apply(self, conn: asyncpg.Connection, schema: str, msg: Message, seq: int) -> None:
        self.fail(msg, seq)
        await conn.execute(
            f"""INSERT INTO {schema}.counts VALUES ($1, 1, $2) ON CONFLICT (container_id)
                DO UPDATE SET n = {schema}.counts.n + 1, last_type = $2""", msg.event.container_id, msg.envelope.type)


@pytest.fixture
async def bus(servers):
    b = await Bus.connect(servers["nats_url"])
    await b.ensure_topology()
    yield b
    await b.close()


@pytest.fixture
async def pool(servers):
    p = await asyncpg.create_pool(servers["database_url"], min_size=1, max_size=6)
    yield p
    await p.close()


async def store_for(pool, projection) -> ProjectionStore:
    store = ProjectionStore(pool, "t_" + uuid7().replace("-", "")[-12:], [projection])
    await store.setup()
    return store


def start_consumer(bus, store, projection, **kw):
    stop = asyncio.Event()
    consumer = OrderedConsumer(bus, f"test-{store.schema}", projection.filter_subjects,
                               position=lambda: store.position(projection),
                               handle=lambda batch: store.apply_batch(projection, batch), **kw)
    task = asyncio.create_task(consumer.run(stop))
    return stop, task


async def wait_for(predicate, timeout=15.0, every=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(every)
    raise AssertionError("condition not reached in time")


async def dlq_entries(bus: Bus, ws: str) -> list:
    out = []
    sub = await bus.js.subscribe(f"levers9dlq.levers9.{ws}.>", ordered_consumer=True)
    try:
        while True:
            try:
                out.append(await sub.next_msg(timeout=0.5))
            except nats.errors.TimeoutError:
                return out
    finally:
        await sub.unsubscribe()


async def test_publish_is_deduplicated_by_envelope_id(bus):
    env = envelope(E.ContainerRequested(container_id="c1"), workspace=new_ws())
    first = await bus.publish(env)
    again = await bus.publish(env)
    assert again.seq == first.seq and again.duplicate and not first.duplicate


async def test_append_with_a_stale_sequence_is_a_conflict_on_the_whole_aggregate(bus):
    ws = new_ws()
    first = await bus.publish(envelope(E.ContainerRequested(container_id="c1"), workspace=ws))
    assert await bus.last_seq(f"levers9.{ws}.container.c1.*") == first.seq
    ok = await bus.append(envelope(E.ContainerScheduled(container_id="c1", worker_id="w1"), workspace=ws), first.seq)
    # a second decision made on the same (now stale) state, even of another event type, must lose
    with pytest.raises(ConcurrencyConflict, match="expected last sequence"):
        await bus.append(envelope(E.PlacementDeferred(container_id="c1", reason="x"), workspace=ws), first.seq)
    await bus.append(envelope(E.ContainerStarted(container_id="c1", worker_id="w1"), workspace=ws), ok.seq)
    with pytest.raises(ConcurrencyConflict):
        await bus.append(envelope(E.ContainerRequested(container_id="c2"), workspace=ws), 5)
    await bus.append(envelope(E.ContainerRequested(container_id="c2"), workspace=ws), 0)


async def test_projection_applies_every_event_once_and_redelivery_changes_nothing(bus, pool):
    ws = new_ws()
    proj = Counting(ws)
    store = await store_for(pool, proj)
    for i in range(300):
        await bus.publish(envelope(E.ContainerRequested(container_id=f"c{i % 10}"), workspace=ws))
    last = await bus.last_seq(f"levers9.{ws}.>")
    stop, task = start_consumer(bus, store, proj, batch=64)
    await wait_for(lambda: _at(store, proj, last))
    stop.set()
    await task
    counts = dict(await pool.fetch(f"SELECT container_id, n FROM {store.schema}.counts"))
    assert counts == {f"c{i}": 30 for i in range(10)}
    # replaying the same range again (a redelivery after a crash) applies nothing
    from levers9.runtime.consumer import to_delivery
    from levers9.runtime.reader import read
    async for msgs in read(bus, proj.filter_subjects):
        assert await store.apply_batch(proj, [to_delivery(m) for m in msgs]) == 0
    assert dict(await pool.fetch(f"SELECT container_id, n FROM {store.schema}.counts")) == counts


async def test_two_processes_writing_one_projection_apply_each_event_once(bus, pool):
    """Two stores on one schema (two workers of a node, two replicas) applying overlapping batches at
    once: the second to get the lock must see the first's position, not the one from before its wait."""
    ws = new_ws()
    proj = Counting(ws)
    first = await store_for(pool, proj)
    second = ProjectionStore(pool, first.schema, [proj])
    for i in range(200):
        await bus.publish(envelope(E.ContainerRequested(container_id=f"c{i % 10}"), workspace=ws))
    from levers9.runtime.consumer import to_delivery
    from levers9.runtime.reader import read
    deliveries = [to_delivery(m) async for msgs in read(bus, proj.filter_subjects) for m in msgs]
    batches = [deliveries[i:i + 20] for i in range(0, len(deliveries), 10)]  # each overlaps the next
    await asyncio.gather(*(store.apply_batch(proj, batch) for batch in batches for store in (first, second)))
    counts = dict(await pool.fetch(f"SELECT container_id, n FROM {first.schema}.counts"))
    assert counts == {f"c{i}": 20 for i in range(10)}


async def _at(store, proj, seq) -> bool:
    return await store.position(proj) >= seq


async def test_bad_messages_go_to_the_dlq_with_a_reason_and_the_rest_flows(bus, pool, servers):
    ws = new_ws()
    poison = "c-poison"

    def fail(msg, seq):
        if msg.event.container_id == poison:
            raise ValueError("this handler cannot take c-poison")

    proj = Counting(ws, fail)
    store = await store_for(pool, proj)
    stop, task = start_consumer(bus, store, proj, max_deliver=3)
    # a plain NATS client, no levers9 code: malformed JSON, then a body missing its id field
    nc = await nats.connect(servers["nats_url"])
    js = nc.jetstream()
    await js.publish(f"levers9.{ws}.container.x1.ContainerRequested", b"{oops", headers={"Nats-Msg-Id": uuid7()})
    bad_body = {"id": uuid7(), "type": "ContainerRequested", "version": 2, "occurred_at": "2026-12-02T00:00:00Z",
                "workspace": ws, "correlation_id": "c", "data": {"cpu_millicores": 5}}
    await js.publish(f"levers9.{ws}.container.x2.ContainerRequested", json.dumps(bad_body).encode(),
                     headers={"Nats-Msg-Id": bad_body["id"]})
    await nc.close()
    await bus.publish(envelope(E.ContainerRequested(container_id=poison), workspace=ws))
    for i in range(5):
        await bus.publish(envelope(E.ContainerRequested(container_id="good"), workspace=ws))
    last = await bus.last_seq(f"levers9.{ws}.>")
    await wait_for(lambda: _at(store, proj, last))
    stop.set()
    await task
    assert dict(await pool.fetch(f"SELECT container_id, n FROM {store.schema}.counts")) == {"good": 5}
    dead = await dlq_entries(bus, ws)
    reasons = {m.headers["Levers9-Original-Subject"].split(".")[3]: m.headers["Levers9-Reason"] for m in dead}
    assert set(reasons) == {"x1", "x2", poison}
    assert "does not decode" in reasons["x1"]
    assert "not valid" in reasons["x2"] and "container_id" in reasons["x2"]
    assert "failed 3 times" in reasons[poison] and "cannot take c-poison" in reasons[poison]
    assert all(m.headers["Levers9-Consumer"] == f"test-{store.schema}" for m in dead)
    assert dead[0].data == b"{oops"  # the payload is kept byte for byte


async def test_a_transient_failure_mid_batch_is_retried_and_applied_exactly_once(bus, pool):
    ws = new_ws()
    failures = {"left": 3}

    def fail(msg, seq):
        if msg.event.container_id == "c7" and failures["left"] > 0:
            failures["left"] -= 1
            raise ConnectionResetError("database went away")  # transient: never dead-lettered

    proj = Counting(ws, fail)
    store = await store_for(pool, proj)
    for i in range(20):
        await bus.publish(envelope(E.ContainerRequested(container_id=f"c{i}"), workspace=ws))
    last = await bus.last_seq(f"levers9.{ws}.>")
    stop, task = start_consumer(bus, store, proj, max_deliver=2)
    await wait_for(lambda: _at(store, proj, last), timeout=30)
    stop.set()
    await task
    rows = dict(await pool.fetch(f"SELECT container_id, n FROM {store.schema}.counts"))
    assert rows == {f"c{i}": 1 for i in range(20)}
    assert failures["left"] == 0
    assert await dlq_entries(bus, ws) == []


async def test_work_consumer_naks_with_backoff_then_dead_letters(bus):
    ws = new_ws()
    seen: dict[str, list[float]] = {}

    async def handle(d):
        cid = d.message.event.container_id
        seen.setdefault(cid, []).append(time.monotonic())
        if cid == "flaky" and len(seen[cid]) < 3:
            raise RuntimeError("not yet")
        if cid == "broken":
            raise RuntimeError("never works")

    stop = asyncio.Event()
    consumer = WorkConsumer(bus, f"work-{ws}", [f"levers9.{ws}.>"], handle=handle, max_deliver=3)
    task = asyncio.create_task(consumer.run(stop))
    for cid in ("flaky", "broken", "fine"):
        await bus.publish(envelope(E.ContainerRequested(container_id=cid), workspace=ws))

    async def done():
        return len(seen.get("flaky", [])) == 3 and len(seen.get("broken", [])) == 3

    await wait_for(done, timeout=20)

    async def settled():  # every message acked or terminated: nothing can be redelivered any more
        try:
            info = await bus.js.consumer_info(subjects.STREAM, f"work-{ws}")
        except NotFoundError:  # the consumer has not created its durable yet
            return False
        return info.num_ack_pending == 0 and info.num_pending == 0

    await wait_for(settled, timeout=20)
    stop.set()
    await task
    assert len(seen["fine"]) == 1
    gaps = [b - a for a, b in zip(seen["flaky"], seen["flaky"][1:])]
    assert gaps[0] >= 0.15 and gaps[1] >= gaps[0] * 1.5  # nak delays grow
    dead = await dlq_entries(bus, ws)
    assert [m.headers["Levers9-Original-Subject"].split(".")[3] for m in dead] == ["broken"]
    assert "failed 3 times" in dead[0].headers["Levers9-Reason"]


async def test_work_consumer_keeps_slow_messages_in_hand_and_a_dead_holders_come_back_after_ack_wait(bus):
    """+WPI while a message is worked on lets the ack wait be short (a dead holder's message comes
    back soon) without another replica taking a message that is only slow."""
    ws = new_ws()
    seen: dict[str, int] = {}
    hold = asyncio.Event()

    async def slow(d):  # each takes 2.5 ack waits: without +WPI the server would redeliver them meanwhile
        cid = d.message.event.container_id
        seen[cid] = seen.get(cid, 0) + 1
        await asyncio.sleep(5.0)

    stop = asyncio.Event()  # two replicas on one durable: an idle one would take an expired message
    replicas = [WorkConsumer(bus, f"slow-{ws}", [f"levers9.{ws}.>"], handle=slow, ack_wait=2.0, batch=2)
                for _ in range(2)]
    tasks = [asyncio.create_task(r.run(stop)) for r in replicas]
    for cid in ("a", "b"):
        await bus.publish(envelope(E.ContainerRequested(container_id=cid), workspace=ws))

    async def settled():
        try:
            info = await bus.js.consumer_info(subjects.STREAM, f"slow-{ws}")
        except NotFoundError:  # the replicas have not created their durable yet
            return False
        return seen.get("b") == 1 and info.num_ack_pending == 0 and info.num_pending == 0

    await wait_for(settled, timeout=20)
    await asyncio.sleep(2.5)  # past one more ack wait: nothing comes again
    stop.set()
    await asyncio.gather(*tasks)
    assert seen == {"a": 1, "b": 1}

    # a holder that dies mid-message (its task cancelled: no ack, no nak) loses it to the next run
    # within about one ack wait, however long handlers may take
    async def stuck(d):
        await hold.wait()

    gone = asyncio.create_task(WorkConsumer(bus, f"die-{ws}", [f"levers9.{ws}.>"], handle=stuck,
                                            ack_wait=2.0).run(asyncio.Event()))
    await wait_for(lambda: _ack_pending(bus, f"die-{ws}"), timeout=10)
    gone.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gone
    died = time.monotonic()
    again: list[float] = []

    async def record(d):
        again.append(time.monotonic() - died)

    stop = asyncio.Event()
    task = asyncio.create_task(WorkConsumer(bus, f"die-{ws}", [f"levers9.{ws}.>"], handle=record,
                                            ack_wait=2.0).run(stop))
    await wait_for(lambda: _async_true(len(again) >= 2), timeout=15)
    stop.set()
    await task
    assert max(again) < 6.0
    # a durable made with another ack wait (an older release's) takes the new one
    await WorkConsumer(bus, f"die-{ws}", [f"levers9.{ws}.>"], handle=record, ack_wait=3.0)._subscribe()
    assert (await bus.js.consumer_info(subjects.STREAM, f"die-{ws}")).config.ack_wait == 3.0


async def test_a_concurrent_work_consumer_runs_up_to_its_concurrency_at_once_each_settled_alone(bus):
    """concurrency N: up to N handlers at once from batched pulls, never more; a slow one is kept in
    hand past the ack wait while the others are acked; a failing one is nak-ed alone and comes again."""
    ws = new_ws()
    seen: dict[str, int] = {}
    running = peak = 0

    async def handle(d):
        nonlocal running, peak
        cid = d.message.event.container_id
        seen[cid] = seen.get(cid, 0) + 1
        running += 1
        peak = max(peak, running)
        try:
            await asyncio.sleep(3.0 if cid == "slow" else 0.4)
            if cid == "flaky" and seen[cid] == 1:
                raise RuntimeError("not yet")
        finally:
            running -= 1

    stop = asyncio.Event()
    consumer = WorkConsumer(bus, f"conc-{ws}", [f"levers9.{ws}.>"], handle=handle, ack_wait=2.0, batch=4,
                            concurrency=4)
    task = asyncio.create_task(consumer.run(stop))
    names = ["slow", "flaky", *(f"c{i}" for i in range(10))]
    began = time.monotonic()
    for cid in names:
        await bus.publish(envelope(E.ContainerRequested(container_id=cid), workspace=ws))

    async def settled():
        try:
            info = await bus.js.consumer_info(subjects.STREAM, f"conc-{ws}")
        except NotFoundError:
            return False
        return seen.get("slow") == 1 and seen.get("flaky") == 2 and info.num_ack_pending == 0 \
            and info.num_pending == 0

    await wait_for(settled, timeout=20)
    took = time.monotonic() - began
    stop.set()
    await task
    assert peak == 4
    assert seen == {"slow": 1, "flaky": 2, **{f"c{i}": 1 for i in range(10)}}  # the slow one was never redelivered
    assert took < 5.0  # one at a time: 3 + 11 x 0.4 s at least


async def _ack_pending(bus, durable: str) -> bool:
    try:
        return (await bus.js.consumer_info(subjects.STREAM, durable)).num_ack_pending > 0
    except NotFoundError:  # not created yet
        return False


async def _async_true(value: bool) -> bool:
    return value


def _nats_binary() -> str:
    here = Path(sys.executable).parent / "nats-server"
    return str(here) if here.exists() else shutil.which("nats-server")


async def test_consumer_recovers_after_a_nats_restart(pool, tmp_path):
    port = free_port()
    cmd = [_nats_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path / "js")]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_for(lambda: _listening(port))
        b = await Bus.connect(f"nats://127.0.0.1:{port}")
        await b.ensure_topology()
        ws = new_ws()
        proj = Counting(ws)
        store = await store_for(pool, proj)
        stop, task = start_consumer(b, store, proj)
        for _ in range(10):
            await b.publish(envelope(E.ContainerRequested(container_id="before"), workspace=ws))
        await wait_for(lambda: _at(store, proj, 10))
        server.send_signal(signal.SIGKILL)
        server.wait()
        await wait_for(lambda: _false(b.nc.is_connected))  # the client has seen the server go
        server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(10):  # publish retries with the same id until the server is back
            await b.publish(envelope(E.ContainerRequested(container_id="after"), workspace=ws))
        await wait_for(lambda: _at(store, proj, 20), timeout=40)
        stop.set()
        await task
        await b.close()
        assert dict(await pool.fetch(f"SELECT container_id, n FROM {store.schema}.counts")) == {"before": 10, "after": 10}
    finally:
        server.kill()
        server.wait()


async def test_rebuild_from_sequence_one_equals_the_live_projection_and_swaps_in(bus, pool):
    ws = new_ws()
    proj = Counting(ws)
    store = await store_for(pool, proj)
    stop, task = start_consumer(bus, store, proj)
    for i in range(200):
        event = (E.ContainerRequested(container_id=f"c{i % 7}") if i % 3 else
                 E.ContainerStarted(container_id=f"c{i % 7}", worker_id="w"))
        await bus.publish(envelope(event, workspace=ws))
    last = await bus.last_seq(f"levers9.{ws}.>")
    await wait_for(lambda: _at(store, proj, last))
    before = sorted(map(tuple, await pool.fetch(f"SELECT * FROM {store.schema}.counts")))
    compare_only = await rebuild(bus, pool, store.schema, [proj], swap=False)
    assert compare_only.equal and not compare_only.swapped
    # more events keep arriving while the rebuild runs: the swap catches up under the lock
    for i in range(30):
        await bus.publish(envelope(E.ContainerRequested(container_id="late"), workspace=ws))
    report = await rebuild(bus, pool, store.schema, [proj])
    assert report.swapped and report.equal, report.tables
    for i in range(5):
        await bus.publish(envelope(E.ContainerRequested(container_id="after-swap"), workspace=ws))
    last = await bus.last_seq(f"levers9.{ws}.>")
    await wait_for(lambda: _at(store, proj, last))
    stop.set()
    await task
    rows = dict(await pool.fetch(f"SELECT container_id, n FROM {store.schema}.counts"))
    assert rows["late"] == 30 and rows["after-swap"] == 5
    assert sum(rows.values()) == 235
    assert {k: v for k, v in rows.items() if k.startswith("c")} == {r[0]: r[1] for r in before}
    assert await pool.fetchval("SELECT count(*) FROM information_schema.schemata WHERE schema_name LIKE $1",
                               f"{store.schema}__%") == 0


async def test_trace_context_and_correlation_travel_from_publisher_to_consumer(bus, pool, caplog):
    """One trace spans publisher -> consumer: the consumer's span continues the publisher's trace (its
    trace id, a span of its own), and its logs carry the envelope's correlation id.
    Services record no span without an exporter (telemetry.sampler_for): the trace goes on all the same."""
    import logging

    from opentelemetry import trace

    from levers9.runtime import telemetry

    caplog.set_level(logging.INFO, logger="levers9.test")
    telemetry.setup_tracing("test")  # as a service does (once per process: a no-op after the first)
    ws = new_ws()
    seen = {}

    async def handle(d):
        seen["cid"] = telemetry.correlation_id.get()
        seen["span"] = trace.get_current_span().get_span_context()
        logging.getLogger("levers9.test").info("handled")

    stop = asyncio.Event()
    consumer = WorkConsumer(bus, f"trace-{ws}", [f"levers9.{ws}.>"], handle=handle)
    task = asyncio.create_task(consumer.run(stop))
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("gateway request") as root:
        env = envelope(E.ContainerRequested(container_id="c1"), workspace=ws)
        await bus.publish(env)
    await wait_for(lambda: _true(seen))
    stop.set()
    await task
    assert seen["cid"] == env.correlation_id
    assert root.get_span_context().is_valid
    assert seen["span"].trace_id == root.get_span_context().trace_id
    assert seen["span"].span_id != root.get_span_context().span_id
    record = next(r for r in caplog.records if r.getMessage() == "handled")
    formatted = json.loads(telemetry.JsonFormatter("test").format(record))
    assert formatted["correlation_id"] == env.correlation_id


async def _true(d) -> bool:
    return bool(d)


async def _false(value) -> bool:
    return not value


async def _listening(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True
