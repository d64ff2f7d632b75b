"""The containers projection (what the gateway routes by) against real Postgres: a report from a
worker other than the one the container is placed on changes nothing but the position; a late one
from a worker the container left after a re-request neither."""

from __future__ import annotations

import asyncpg
import pytest

from levers9.contracts import decode, encode, envelope, uuid7
from levers9.contracts import events as E
from levers9.runtime.consumer import Delivery
from levers9.runtime.projection import ProjectionStore
from levers9.runtime.views import ContainersView


@pytest.fixture
async def pool(servers):
    p = await asyncpg.create_pool(servers["database_url"], min_size=1, max_size=2)
    yield p
    await p.close()


async def test_only_the_placed_worker_moves_a_container(pool):
    view = ContainersView()
    store = ProjectionStore(pool, "t_" + uuid7().replace("-", "")[-12:], [view])
    await store.setup()
    seq = 0

    async def apply(event) -> dict:
        nonlocal seq
        seq += 1
        env = envelope(event, workspace="acme")
        data = encode(env)
        await store.apply_batch(view, [Delivery(seq, env.subject, data, {}, 1, message=decode(data, env.subject))])
        row = await pool.fetchrow(f"SELECT status, worker_id, address, last_seq FROM {store.schema}.containers "
                                  "WHERE container_id = 'c1'")
        return dict(row)

    await apply(E.ContainerRequested(container_id="c1"))
    await apply(E.ContainerScheduled(container_id="c1", worker_id="w1"))
    assert (await apply(E.ContainerReady(container_id="c1", worker_id="w1", address="http://a:1")))["address"] == "http://a:1"
    # another worker says it runs c1 at its own address, then that it stopped: ignored, position kept
    row = await apply(E.ContainerReady(container_id="c1", worker_id="w2", address="http://evil:1"))
    assert row == {"status": "ready", "worker_id": "w1", "address": "http://a:1", "last_seq": 4}
    row = await apply(E.ContainerStopped(container_id="c1", worker_id="w2"))
    assert (row["status"], row["worker_id"], row["last_seq"]) == ("ready", "w1", 5)
    # re-placed on w2 after w1 was lost: w2's reports apply, a late one from w1 does not
    await apply(E.ContainerRequested(container_id="c1", attempt=2))
    await apply(E.ContainerScheduled(container_id="c1", worker_id="w2", attempt=2))
    assert (await apply(E.ContainerReady(container_id="c1", worker_id="w2", address="http://b:1")))["status"] == "ready"
    row = await apply(E.ContainerFailed(container_id="c1", worker_id="w1", reason="late"))
    assert (row["status"], row["worker_id"], row["address"]) == ("ready", "w2", "http://b:1")
    assert (await apply(E.ContainerStopped(container_id="c1", worker_id="w2")))["status"] == "stopped"
    # a stop asked for after it stopped (a `containers stop` that crossed a scale-down) leaves it
    # stopped: listed as "stopping" it stayed live forever, nobody left to stop it
    row = await apply(E.ContainerStopRequested(container_id="c1", reason="stopped by user"))
    assert (row["status"], row["last_seq"]) == ("stopped", 11)
    await apply(E.ContainerRequested(container_id="c1", attempt=3))  # only a new request starts it again
    assert (await apply(E.ContainerStopRequested(container_id="c1")))["status"] == "stopping"
