"""A batch of tasks in one request (`POST /taskqueue/NAME/batch`, levers9.gateway.task_batch): what a
body may be (each item what a single put takes, refused naming its index), publishes gathered with
the ones that failed reported, the route wired to a fake state; and the SDK's `put_many` bodies."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx
import msgspec
import pytest

from levers9.contracts import decode
from levers9.contracts import events as E
from levers9.contracts.spec import decode_spec
from levers9.gateway.auth import Caller
from levers9.gateway.body_rules import TASK_PAYLOAD_LIMIT, body_rule
from levers9.gateway.service import GatewayService
from levers9.gateway.state import Deployment
from levers9.gateway.task_batch import BatchRefused, payloads, publish_all
from levers9.runtime.bus import Appended
from levers9.runtime.config import Settings
from levers9.runtime.tokens import token_hash
from levers9.task_queues import task_batches

USER, OTHER = "l9_user", "l9_other"


# ---- the body -------------------------------------------------------------------------------------

def test_each_item_is_what_a_single_put_takes():
    body = json.dumps([{"args": [1], "kwargs": {"d": 2}}, {"x": 3}, {}, {"args": []}]).encode()
    assert [json.loads(p) for p in payloads(body, TASK_PAYLOAD_LIMIT)] == [
        {"args": [1], "kwargs": {"d": 2}}, {"args": [], "kwargs": {"x": 3}}, {"args": [], "kwargs": {}},
        {"args": [], "kwargs": {}}]


@pytest.mark.parametrize(("body", "status", "says"), [
    (b"", 422, "JSON array"),
    (b"{not json", 422, "not JSON"),
    (b'{"args": [1]}', 422, "JSON array"),
    (b"[]", 422, "empty"),
    (json.dumps([{}] * 1001).encode(), 422, "1001 tasks; at most 1000"),
    (json.dumps([{}, 7]).encode(), 422, "task 1 of the batch"),
    (json.dumps([{}, {"args": "x"}]).encode(), 422, "task 1 of the batch: args must be"),
    (json.dumps([{}, {}, {"args": ["x" * 300]}]).encode(), 413, "task 2 of the batch: its arguments are"),
])
def test_a_bad_batch_is_refused_with_a_sentence(body, status, says):
    with pytest.raises(BatchRefused) as caught:
        payloads(body, 256)
    assert caught.value.status == status and says in caught.value.detail


def test_a_batch_s_body_is_held_to_the_call_limit_and_a_single_put_to_the_task_s():
    limits = {"code_limit": 1, "file_limit": 2, "call_limit": 16 << 20}
    batch = body_rule("POST", "/taskqueue/sq/batch", **limits)
    single = body_rule("POST", "/taskqueue/batch", **limits)  # a queue named "batch"
    assert batch is not None and batch.limit == 16 << 20 and batch.json
    assert single is not None and single.limit == TASK_PAYLOAD_LIMIT


async def test_publishes_run_concurrently_bounded_and_failures_are_reported_by_id():
    at_once, peak = 0, 0

    async def publish(task_id: str) -> None:
        nonlocal at_once, peak
        at_once += 1
        peak = max(peak, at_once)
        await asyncio.sleep(0.01)
        at_once -= 1
        if task_id in ("t3", "t7"):
            raise ConnectionError("nats went away")

    done = await publish_all([f"t{i}" for i in range(10)], publish, in_flight=4)
    assert peak == 4
    assert done.ids == [f"t{i}" for i in range(10) if i not in (3, 7)]
    assert [t for t, _ in done.failed] == ["t3", "t7"] and "ConnectionError: nats went away" in done.failed[0][1]


# ---- the route ------------------------------------------------------------------------------------

class NoRows:
    async def fetchrow(self, query: str, *args: Any) -> None:
        return None


class FakeBus:
    def __init__(self, failing: int = 0) -> None:
        self.published: list[Any] = []
        self.failing = failing  # how many publishes fail (the last ones)
        self.calls = 0

    async def publish(self, env: Any) -> Appended:
        self.calls += 1
        if self.calls > 3 - self.failing and self.failing:
            raise TimeoutError("no ack")
        self.published.append(env)
        return Appended(seq=len(self.published), duplicate=False)

    def events(self) -> list[E.Event]:
        return [decode(msgspec.json.encode(env)).event for env in self.published]


@pytest.fixture
def gw():
    g = GatewayService(Settings.load(env={"LEVERS9_SECRET_KEY": ""}))
    g.bus = FakeBus()
    g.pool = NoRows()
    g.tokens = {token_hash(USER): Caller(workspace="default", token_id="u"),
                token_hash(OTHER): Caller(workspace="other", token_id="o")}
    spec = decode_spec(json.dumps({"name": "sq", "app_name": "jobs", "code": {"kind": "function", "module": "m",
                                                                               "handler": "sq"},
                                   "task_queue": {"retries": 2, "ttl": 60}}))
    g.deployments[("default", "sq", "latest")] = Deployment("default", "d1", "sq", 1, "active", spec)
    return g


@contextlib.asynccontextmanager
async def client(gw: GatewayService, token: str = USER):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gw.app()), base_url="http://gw",
                                 headers={"Authorization": f"Bearer {token}"}) as c:
        yield c


async def test_a_batch_enqueues_each_task_with_its_own_id_and_the_queue_s_options(gw):
    async with client(gw) as c:
        r = await c.post("/taskqueue/sq/batch", json=[{"args": [1]}, {"args": [2]}, {"x": 3}])
    assert r.status_code == 202, r.text
    ids = r.json()["task_ids"]
    assert r.json()["queue"] == "sq" and len(set(ids)) == 3
    events = gw.bus.events()
    assert [e.task_id for e in events] == ids and [env.id for env in gw.bus.published] == ids  # id = envelope id
    assert [json.loads(e.payload) for e in events] == [{"args": [1], "kwargs": {}}, {"args": [2], "kwargs": {}},
                                                        {"args": [], "kwargs": {"x": 3}}]
    assert {(e.deployment_id, e.queue, e.function, e.retries, e.ttl_seconds, e.token_id) for e in events} == \
        {("d1", "sq", "jobs.sq", 2, 60.0, "u")}


async def test_a_batch_refused_or_for_another_workspace_enqueues_nothing(gw):
    async with client(gw) as c:
        big = await c.post("/taskqueue/sq/batch", json=[{}, {"args": ["x" * (TASK_PAYLOAD_LIMIT + 1)]}])
        assert big.status_code == 413 and "task 1 of the batch" in big.json()["detail"]
        assert (await c.post("/taskqueue/sq/batch", json=[])).status_code == 422
    async with client(gw, OTHER) as c:
        r = await c.post("/taskqueue/sq/batch", json=[{}])
        assert r.status_code == 404 and "no task queue 'sq' in workspace 'other'" in r.json()["detail"]
    assert gw.bus.published == []


async def test_a_batch_partly_appended_answers_503_naming_what_was(gw):
    gw.bus = FakeBus(failing=1)
    async with client(gw) as c:
        r = await c.post("/taskqueue/sq/batch", json=[{}, {}, {}])
    assert r.status_code == 503
    body = r.json()
    assert "1 of the 3 tasks could not be appended" in body["detail"] and "TimeoutError" in body["detail"]
    assert body["task_ids"] == [env.id for env in gw.bus.published] and len(body["unconfirmed"]) == 1


# ---- the SDK ----------------------------------------------------------------------------------------

def test_put_many_is_map_like_and_chunked():
    bodies = [json.loads(b) for b in task_batches((range(5),), {"delay": 1}, size=2)]
    assert [len(b) for b in bodies] == [2, 2, 1]
    assert bodies[0] == [{"args": [0], "kwargs": {"delay": 1}}, {"args": [1], "kwargs": {"delay": 1}}]
    zipped = [json.loads(b) for b in task_batches(([1, 2, 3], "ab"), {})]
    assert zipped == [[{"args": [1, "a"], "kwargs": {}}, {"args": [2, "b"], "kwargs": {}}]]  # zip: the shortest
    assert list(task_batches(([],), {})) == []
    with pytest.raises(TypeError, match="at least one iterable"):
        list(task_batches((), {}))
    with pytest.raises(TypeError, match="travel as JSON"):
        list(task_batches(([object()],), {}))
