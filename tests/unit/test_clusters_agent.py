"""The attached cluster's pieces that need no platform: the manifest `clusters attach` prints, the
agent's reading of a start request and its pods against the fake Kubernetes API, the pool controller's
start request, the gateway's relay and stream refusal."""

from __future__ import annotations

import asyncio
import base64
import json
import random

import pytest
import yaml
from fakes.fake_k8s_api import FakeKubernetesAPI, schema_errors
from hypothesis import given, settings
from kubernetes import client
from nats.errors import NoRespondersError
from settings_strategies import CREDENTIALS, MARK, any_settings

from levers9.agent import AgentConfig, backoff, handle, stream_url
from levers9.agent_manifest import objects, render
from levers9.agent_pods import BadRequest, Pods, read_start, settings_for
from levers9.gateway.auth import Caller
from levers9.gateway.cluster_relay import Agent, ClusterRelay, parse_op
from levers9.gateway.routes_clusters import stream_refusal
from levers9.pool_controller.backends_cluster import ClusterBackend, refusal, start_request
from levers9.pool_controller.pools import PoolConfig
from levers9.runtime import k8s_manifests as M
from levers9.runtime.config import Settings

NS = "levers9-agent"
POOL = PoolConfig("edge", backend="cluster", cluster="c1", worker_cpu_millicores=2000, worker_memory_mib=2048,
                  worker_secret="levers9-pool", namespace="platform-ns-never-sent")
LOCAL = Settings().with_(nats_url="nats://127.0.0.1:4222", gateway_url="http://127.0.0.1:8000",
                 s3_endpoint="http://127.0.0.1:8333", registry="127.0.0.1:5000",
                 **{c: MARK + c for c in CREDENTIALS})


# ---- the manifest ----------------------------------------------------------------------------------

def test_the_manifest_is_valid_and_grants_pods_and_secrets_in_its_namespace_only():
    docs = list(yaml.safe_load_all(render("c1", "l9_join", "https://gw.example", "team-a")))
    assert [d["kind"] for d in docs] == ["Namespace", "ServiceAccount", "Role", "RoleBinding", "Secret", "Deployment"]
    for doc in docs:
        assert schema_errors(doc) == [], doc["kind"]
        assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "team-a"
    role = docs[2]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods", "secrets"],
                              "verbs": ["create", "get", "list", "watch", "delete"]}]
    assert base64.b64decode(docs[4]["data"]["token"]).decode() == "l9_join"
    container = docs[5]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["agent"] and docs[5]["spec"]["replicas"] == 1
    env = {e["name"]: e for e in container["env"]}
    assert env["LEVERS9_AGENT_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == docs[4]["metadata"]["name"]
    assert "l9_join" not in json.dumps(docs[5])  # the token only in its Secret


def test_the_schema_check_is_not_vacuous():
    bad = objects("c1", "t", "http://g")[2]
    bad["rules"][0]["verbz"] = ["get"]
    assert schema_errors(bad) != []


# ---- the start request: pool controller -> agent --------------------------------------------------



@settings(max_examples=50, deadline=None)
@given(any_settings())
def test_no_platform_credential_leaves_for_the_cluster(s):
    body = start_request(POOL, "edge-1", "l9_worker", s, {"nats.creds": "own user"})
    assert MARK not in json.dumps(body)
    assert "namespace" not in body["pool"] and set(body["env"]) <= {f"LEVERS9_{n.upper()}" for n in M.WORKER_SETTINGS}
    start = read_start(body, NS, "http://10.210.0.1:8000")
    pod = M.pod_manifest(start.pool, start.worker_id, start.settings, sorted(start.bus))
    assert MARK not in json.dumps(pod) and pod["metadata"]["namespace"] == NS


def test_the_agent_narrows_a_start_request_and_rewrites_loopback_to_the_gateway_host():
    body = start_request(POOL, "edge-1", "l9_worker", LOCAL, {"nats.creds": "c", "worker.sign": "s"})
    body["files"]["evil"] = "x"
    body["env"]["LEVERS9_DATABASE_URL"] = "postgres://platform"
    body["pool"]["namespace"] = "kube-system"
    s = read_start(body, NS, "http://10.210.0.1:8000")
    assert s.pool.namespace == NS and s.token == "l9_worker" and set(s.bus) == {"nats.creds", "worker.sign"}
    assert s.settings.nats_url == "nats://10.210.0.1:4222" and s.settings.registry == "10.210.0.1:5000"
    assert not hasattr(s.settings, "database_url")
    assert settings_for({"LEVERS9_NATS_URL": "nats://nats.example:4222"}, "http://10.210.0.1:8000").nats_url \
        == "nats://nats.example:4222"
    for broken in ({**body, "worker_id": "a.b"}, {**body, "files": {}}, {**body, "pool": {"name": "x", "bogus": 1}}):
        if "bogus" in broken["pool"]:
            assert read_start(broken, NS, "http://g").pool.name == "x"  # unknown keys are dropped
            continue
        with pytest.raises(BadRequest):
            read_start(broken, NS, "http://g")


# ---- the agent's pods, against the fake API --------------------------------------------------------

@pytest.fixture
def fake():
    with FakeKubernetesAPI() as api:
        yield api


def _pods(fake) -> Pods:
    cfg = client.Configuration()
    cfg.host = fake.url
    return Pods(client.CoreV1Api(client.ApiClient(cfg)), NS, timeout=60)  # a ceiling: the fake is a thread of a loaded process


def test_start_creates_a_valid_secret_and_pod_and_stop_deletes_them(fake):
    pods, cfg = _pods(fake), AgentConfig("http://10.210.0.1:8000", "t", "c1", NS)
    body = start_request(POOL, "edge-1", "l9_worker", LOCAL, {"nats.creds": "own"})
    reply = handle(pods, cfg, {**body, "type": "start", "id": "7"})
    assert reply == {"type": "reply", "id": "7", "ok": True, "error": ""}
    name = M.object_name("edge-1")
    pod, secret = fake.objects("pods", NS)[name], fake.objects("secrets", NS)[name]
    assert all(schema_errors(o) == [] for o in fake.state.received)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["LEVERS9_NATS_URL"]["value"] == "nats://10.210.0.1:4222"
    assert env["LEVERS9_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "levers9-pool"
    assert base64.b64decode(secret["data"]["token"]).decode() == "l9_worker"
    assert handle(pods, cfg, {"type": "stop", "id": "8", "worker_id": "edge-1"})["ok"]
    assert fake.objects("pods", NS) == {} and fake.objects("secrets", NS) == {}


def test_a_refused_start_says_why_and_leaves_no_token_behind(fake):
    pods, cfg = _pods(fake), AgentConfig("http://g", "t", "c1", NS)
    fake.fail_next("POST", "pods", 403, "Forbidden", "pods is forbidden")
    reply = handle(pods, cfg, {**start_request(POOL, "edge-2", "t", LOCAL, {}), "type": "start", "id": "1"})
    assert not reply["ok"] and "HTTP 403" in reply["error"] and "forbidden" in reply["error"]
    assert fake.objects("secrets", NS) == {}
    no_secret = PoolConfig("edge", backend="cluster", cluster="c1")
    reply = handle(pods, cfg, {**start_request(no_secret, "edge-3", "t", LOCAL, {}), "type": "start", "id": "2"})
    assert not reply["ok"] and "worker_secret" in reply["error"]


def test_pods_that_end_are_reported_once(fake):
    pods, cfg = _pods(fake), AgentConfig("http://g", "t", "c1", NS)
    for wid in ("edge-1", "edge-2"):
        assert handle(pods, cfg, {**start_request(POOL, wid, "t", LOCAL, {}), "type": "start", "id": wid})["ok"]
    assert pods.ended() == {}
    fake.set_phase(NS, M.object_name("edge-1"), "Failed", exit_code=137)
    fake.delete_out_of_band("pods", NS, M.object_name("edge-2"))
    ended = pods.ended()
    assert set(ended) == {"edge-1", "edge-2"} and "137" in ended["edge-1"]
    assert pods.ended() == {} and fake.objects("secrets", NS) == {}


def test_stream_url_and_backoff():
    assert stream_url("https://gw.example/base/", "c1", NS) == \
        f"wss://gw.example/base/api/v1/clusters/c1/agent?namespace={NS}"
    rng = random.Random(1)
    waits = [backoff(n, rng) for n in range(1, 10)]
    assert 0.8 <= waits[0] <= 1.2 and all(w <= 36 for w in waits) and waits[-1] >= 24


# ---- the gateway's side ------------------------------------------------------------------------------

ROW = {"workspace": "a", "token_id": "t1", "detached": False}


def test_only_the_current_join_token_of_that_cluster_opens_its_stream():
    join = Caller(workspace="a", token_id="t1", scope="cluster:c1")
    assert stream_refusal(join, "c1", ROW) == (0, "")
    assert stream_refusal(None, "c1", ROW)[0] == 401
    assert stream_refusal(Caller(workspace="a", token_id="t9", scope="workspace"), "c1", ROW)[0] == 403
    assert stream_refusal(Caller(workspace="a", token_id="t2", scope="cluster:c2"), "c1", ROW)[0] == 403
    assert stream_refusal(join, "c1", {**ROW, "detached": True})[0] == 403
    assert stream_refusal(join, "c1", {**ROW, "token_id": "t-new"})[0] == 403  # attached again: old token out
    assert stream_refusal(Caller(workspace="b", token_id="t1", scope="cluster:c1"), "c1", ROW)[0] == 403
    assert stream_refusal(join, "c1", None)[0] == 403


def test_the_relay_answers_with_the_agents_reply_and_keeps_only_its_own_workers_exits():
    async def scenario():
        sent: list[dict] = []
        relay = ClusterRelay(lambda: None)
        agent = Agent("c1", "a", lambda text: _record(sent, text))
        task = asyncio.create_task(relay.relay(agent, "levers9rpc.cluster.c1.start", b'{"worker_id": "w1"}'))
        await asyncio.sleep(0.01)
        assert sent[0]["type"] == "start" and sent[0]["worker_id"] == "w1"
        relay.report(agent, {"type": "reply", "id": sent[0]["id"], "ok": True})
        assert (await task)["ok"]
        relay.report(agent, {"type": "exited", "worker_id": "w1", "why": "its pod failed"})
        relay.report(agent, {"type": "exited", "worker_id": "someone-elses", "why": "x"})
        assert await relay.relay(agent, "levers9rpc.cluster.c1.exited", b"") == \
            {"ok": True, "exited": {"w1": "its pod failed"}}
        assert (await relay.relay(agent, "levers9rpc.cluster.c1.bogus", b"{}"))["ok"] is False
    asyncio.run(scenario())


async def _record(sent: list, text: str) -> None:
    sent.append(json.loads(text))


def test_parse_op_is_per_cluster():
    assert parse_op("levers9rpc.cluster.c1.start", "c1") == "start"
    assert parse_op("levers9rpc.cluster.c10.start", "c1") == ""


# ---- the pool controller's backend ---------------------------------------------------------------------

class _Bus:
    def __init__(self, answer):
        self.nc = self
        self.answer, self.asked = answer, []

    async def request(self, subject, data, timeout):
        self.asked.append((subject, json.loads(data)))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return type("M", (), {"data": json.dumps(self.answer).encode()})()


def test_a_start_with_no_agent_connected_fails_with_the_reason_in_the_pools_decision():
    async def scenario():
        bus = _Bus(NoRespondersError())
        b = ClusterBackend(LOCAL, "", lambda: bus)
        b.start_worker(POOL, "edge-1", "l9_w")
        await asyncio.sleep(0.05)
        assert b.exited() == ["edge-1"] and "agent is not connected" in b.note(POOL)
        assert bus.asked[0][0] == "levers9rpc.cluster.c1.start" and MARK not in json.dumps(bus.asked)
        ok = _Bus({"ok": True})
        b.bus = lambda: ok
        b.start_worker(POOL, "edge-2", "l9_w")
        await asyncio.sleep(0.05)
        assert b.exited() == [] and b.note(POOL) == ""
        for t in b.tasks:
            t.cancel()
    asyncio.run(scenario())


def test_refusal_texts():
    assert refusal("c1", None, {"ok": True}) == ""
    assert "HTTP 403" in refusal("c1", None, {"ok": False, "error": "HTTP 403"})
    assert "did not answer" in refusal("c1", asyncio.TimeoutError(), None)


def test_exits_the_agent_reports_make_lost_workers_of_that_cluster_only(monkeypatch):
    from levers9.pool_controller import backends_cluster

    monkeypatch.setattr(backends_cluster, "EXITED_EVERY_S", 0.01)

    class Answers(_Bus):
        async def request(self, subject, data, timeout):
            self.asked.append((subject, json.loads(data)))
            body = {"ok": True, "exited": {"edge-1": "its pod failed (exit code 137)", "other-9": "x"}} \
                if subject.endswith(".exited") else {"ok": True}
            return type("M", (), {"data": json.dumps(body).encode()})()

    async def scenario():
        bus = Answers(None)
        b = ClusterBackend(LOCAL, "", lambda: bus)
        b.workers["other-9"] = "c2"  # started on another cluster: c1's agent cannot end it
        b.start_worker(POOL, "edge-1", "l9_w")
        for _ in range(100):
            await asyncio.sleep(0.01)
            if b.gone:
                break
        assert b.exited() == ["edge-1"] and "other-9" in b.workers
        for t in b.tasks:
            t.cancel()
    asyncio.run(scenario())


def test_the_agent_stops_on_a_refused_token_and_dials_again_after_a_dropped_stream(fake):
    from aiohttp import web

    from levers9 import agent as agent_mod

    seen: list[str] = []

    async def scenario():
        async def stream(request):
            seen.append(request.headers.get("Authorization", ""))
            if len(seen) >= 3:
                return web.json_response({"detail": "revoked"}, status=403)
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            await ws.close()  # dropped at once: the agent must dial again
            return ws

        app = web.Application()
        app.router.add_get("/api/v1/clusters/c1/agent", stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            cfg = AgentConfig(f"http://127.0.0.1:{port}", "l9_join", "c1", NS)
            with pytest.raises(agent_mod.Refused, match="HTTP 403"):
                await asyncio.wait_for(agent_mod.run(cfg, _pods(fake)), 20)
        finally:
            await runner.cleanup()

    import unittest.mock as mock
    with mock.patch.object(agent_mod, "backoff", lambda attempt, rng=None: 0.05):
        asyncio.run(scenario())
    assert seen == ["Bearer l9_join"] * 3
