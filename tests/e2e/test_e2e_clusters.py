"""Attached clusters, end to end: workspace `default` (A) attaches cluster c1; its agent runs in a host
network namespace of its own with a FAKE Kubernetes API as its cluster (tests/fakes/fake_kubelet.py:
the fake API plus a fake kubelet that runs each worker pod the agent creates as a real worker process
in another host namespace). Nothing connects into the cluster: the agent dials the gateway, the
worker dials NATS, Postgres and S3 over the underlay.

- a start before the agent is connected fails, with the reason in the pool's last decision;
- a join token of another workspace, of another cluster or no token is refused by the stream (401/403);
- A's deployment in the cluster's pool lands on the cluster's worker and answers through the gateway;
- workspace B's deployment in that pool is deferred with the reason, never lands there, and does not
  make the pool controller start a worker of A's cluster for it;
- after `levers9 clusters share c1 --workspace teamb`, B's runs there too and answers;
- `levers9 clusters detach c1` cuts the agent off: dialling again it is refused and exits with code 2.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import httpx
import pytest
from _e2e import bus_auth, cli, needs_runc, wait_until

pytestmark = pytest.mark.slow
needs_runc()
FAKES = Path(__file__).parents[1] / "fakes"
NS = "levers9-agent"

APP = '''
import os
from levers9 import App

app = App("edgeapp")


@app.endpoint(cpu=0.25, memory="128Mi", keep_warm_seconds=600, timeout=60, pool="edge", secrets=["EDGE_SECRET"])
def edgeapp():
    return {"container_id": os.environ.get("LEVERS9_CONTAINER_ID", ""), "secret": os.environ.get("EDGE_SECRET", "")}
'''
POOLS = '''[pools.edge]
backend = "cluster"
cluster = "default/c1"  # a cluster is WORKSPACE/NAME on the platform
min_warm = 0
max_workers = 2
idle_timeout_s = 600
worker_cpu_millicores = 1000
worker_memory_mib = 1024
worker_secret = "levers9-pool"
criu = false
'''


def api(env, method: str, path: str, token: str | None = None, timeout: float = 60, **kw) -> httpx.Response:
    """A gateway call with `token` (default: the profile's, workspace `default`)."""
    import tomllib

    p = tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())
    return httpx.request(method, p["gateway_url"] + path, headers={"Authorization": f"Bearer {token or p['token']}"},
                         timeout=timeout, **kw)


def components(env) -> dict[str, str]:
    return {c["name"]: c["url"] for c in json.loads(cli(env, "status", "--json").stdout)["components"]}


def workspace_env(env, workspace: str) -> dict:
    """A profile of another workspace: its own token (as test_e2e_isolation makes one)."""
    from levers9.cli import publish_token

    token = "l9_" + uuid.uuid4().hex
    asyncio.run(publish_token(components(env)["nats"], token, "clusters e2e", workspace=workspace,
                              auth=bus_auth(env)))
    other = {**env, "LEVERS9_TOKEN": token}
    wait_until(lambda: api(other, "GET", "/api/v1/clusters", token, timeout=10).status_code == 200, timeout=60)
    return other


def call(env, token: str | None = None, timeout: float = 120):
    return api(env, "POST", "/endpoint/edgeapp", token, timeout=timeout, json={})


def stream_status(url: str, token: str | None) -> int:
    """The HTTP status with which the gateway answers an agent's stream handshake."""
    async def dial() -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with aiohttp.ClientSession() as s:
            try:
                async with s.ws_connect(url, headers=headers):
                    return 101
            except aiohttp.WSServerHandshakeError as e:
                return e.status
    return asyncio.run(dial())


def containers(env, token: str | None = None) -> list[dict]:
    return [c for c in api(env, "GET", "/api/v1/containers", token).json() if c.get("deployment_name") == "edgeapp"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from levers9.runtime import hosts
    from levers9.runtime.config import Settings

    home = tmp_path_factory.mktemp("l9clusters")
    (home / "pools.toml").write_text(POOLS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    env.update(LEVERS9_HOME=str(home), LEVERS9_POOLS_FILE=str(home / "pools.toml"))
    procs: list[subprocess.Popen] = []
    plans = []
    try:
        cli(env, "up")
        urls = components(env)
        s = Settings.load(env={"LEVERS9_HOME": str(home)})
        gw = hosts.ensure_underlay(s.network.hosts_bridge, s.network.hosts_subnet, [u for u in urls.values() if u])
        marker = home / "hosts" / "live"
        node, worker_host = (hosts.add_host(s.network.hosts_bridge, s.network.hosts_subnet, s.network.hosts_container_supernet, marker)
                             for _ in range(2))
        plans += [node, worker_host]
        yield {"env": env, "home": home, "urls": urls, "gw": gw, "node": node, "worker_host": worker_host,
               "settings": s, "procs": procs}
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                p.kill()
        cli(env, "down", check=False)
        for plan in plans:
            hosts.remove_host(plan)


def start_cluster(stack, token: str) -> None:
    """The fake cluster node (API + kubelet) and the agent, both in the node's own namespace."""
    home, s, gw = stack["home"], stack["settings"], stack["gw"]
    db = stack["urls"]["postgres"]
    pool_secret = home / "pool-secret.json"  # what the cluster's admin puts in the pool's Secret
    pool_secret.write_text(json.dumps({"database_url": _rewrite(db, gw), "s3_access_key": s.storage.s3_access_key,
                                       "s3_secret_key": s.storage.s3_secret_key}))
    kubeconfig = home / "c1-kubeconfig.json"
    netns = f"--net=/run/netns/{stack['node'].netns}"
    log = (home / "fake-cluster.log").open("ab")
    stack["procs"].append(subprocess.Popen(
        ["nsenter", netns, "--", sys.executable, str(FAKES / "fake_kubelet.py"), "--namespace", NS,
         "--worker-netns", stack["worker_host"].netns, "--state", str(home / "c1-node"),
         "--kubeconfig-out", str(kubeconfig), "--pool-secret", "levers9-pool", "--pool-secret-json", str(pool_secret),
         "--hosts-subnet", s.network.hosts_subnet, "--supernet", s.network.hosts_container_supernet],
        stdout=log, stderr=log, env={**stack["env"], "PYTHONUNBUFFERED": "1"}))
    wait_until(kubeconfig.exists, timeout=30)
    agent_log = (home / "agent.log").open("ab")
    gateway = _rewrite(stack["urls"]["gateway"], gw)
    agent_env = {k: v for k, v in stack["env"].items() if not k.startswith("LEVERS9_")}
    stack["procs"].append(subprocess.Popen(
        ["nsenter", netns, "--", sys.executable, "-m", "levers9", "agent", "--gateway", gateway, "--token", token,
         "--cluster", "c1", "--namespace", NS, "--kubeconfig", str(kubeconfig)],
        stdout=agent_log, stderr=agent_log, env={**agent_env, "HOME": str(home)}))


def _rewrite(url: str, gw: str) -> str:
    from levers9.runtime.hosts import rewrite_url

    return rewrite_url(url, gw)


def edge_workers(env) -> set[str]:
    """Every worker the pool `edge` ever had (lost ones too)."""
    return {w["worker_id"] for w in api(env, "GET", "/api/v1/workers").json() if w["pool"] == "edge"}


def pool_decision(env) -> str:
    """The pool `edge`'s last decision, from the pool controller's health document."""
    url = components(env)["pool-controller"].rstrip("/")
    doc = httpx.get(f"{url}/healthz", timeout=10).json()
    return str(doc.get("pools", {}).get("edge", {}).get("last_decision", doc))


def test_an_attached_cluster_serves_its_workspace_and_those_it_is_shared_with(stack, tmp_path):
    env = stack["env"]
    t0 = time.monotonic()
    attached = json.loads(cli(env, "clusters", "attach", "c1", "--json", "--namespace", NS).stdout)
    token = attached["token"]
    assert attached["workspace"] == "default" and "kind: Deployment" in attached["manifest"]
    b = workspace_env(env, "teamb")
    b_token = b["LEVERS9_TOKEN"]
    ws_url = stack["urls"]["gateway"].replace("http://", "ws://") + "/api/v1/clusters/c1/agent"
    assert stream_status(ws_url, None) == 401
    assert stream_status(ws_url, "l9_not-a-token") == 401
    assert stream_status(ws_url, b_token) == 403  # a workspace token, and another workspace's
    other = json.loads(cli(env, "clusters", "attach", "c2", "--json").stdout)["token"]
    assert stream_status(ws_url, other) == 403  # the join token of another cluster
    assert stream_status(ws_url.replace("/c1/", "/c2/"), token) == 403
    # B cannot share A's cluster (nor any: sharing is a platform admin's), nor detach it: it is not B's
    refused = api(b, "POST", "/api/v1/clusters/c1/share", b_token, json={"workspace": "teamb", "owner": "default"})
    assert refused.status_code == 403 and "needs a platform admin's token" in refused.json()["detail"], refused.text
    assert api(b, "DELETE", "/api/v1/clusters/c1", b_token).status_code == 404
    # names are each workspace's: B's own c1 is another cluster (teamb/c1), its token opens only that one
    b_c1 = api(b, "POST", "/api/v1/clusters", b_token, json={"name": "c1"})
    assert b_c1.status_code == 201 and b_c1.json()["ref"] == "teamb/c1", b_c1.text
    # its join token opens the stream of teamb/c1 (the token's workspace says whose c1), never A's
    assert stream_status(ws_url, b_c1.json()["token"]) == 101
    assert api(b, "DELETE", "/api/v1/clusters/c1", b_token).status_code == 200
    assert [c["ref"] for c in json.loads(cli(env, "clusters", "list", "--json").stdout)] == ["default/c1", "default/c2"]

    app = tmp_path / "edgeapp.py"
    app.write_text(APP)
    # each workspace's own secret: a cluster's worker has no keyring, the gateway opens it for it
    cli(env, "secret", "create", "EDGE_SECRET", "of-default")
    cli(b, "secret", "create", "EDGE_SECRET", "of-teamb")
    cli(env, "deploy", str(app))
    # no agent yet: a call asks for a container, the pool controller's start fails, and says why
    with pytest.raises(httpx.TimeoutException):
        call(env, timeout=3)
    try:
        wait_until(lambda: "agent is not connected" in pool_decision(env), timeout=60)
    except AssertionError:
        raise AssertionError(f"pool decision: {pool_decision(env)}") from None

    start_cluster(stack, token)
    wait_until(lambda: any(c["name"] == "c1" and c["agent"] == "connected"
                           for c in json.loads(cli(env, "clusters", "list", "--json").stdout)), timeout=60)
    r = call(env, timeout=240)
    assert r.status_code == 200, r.text
    assert r.json()["secret"] == "of-default", r.json()
    ours = [c for c in containers(env) if c["container_id"] == r.json()["container_id"]]
    worker = ours[0]["worker_id"]
    assert worker.startswith("edge-"), ours
    w = next(w for w in api(env, "GET", "/api/v1/workers").json() if w["worker_id"] == worker)
    assert urlsplit(w["address"]).hostname == stack["worker_host"].address  # the cluster node's address
    assert w["cluster"] == "default/c1"

    # B's deployment in that pool waits with the reason, and never lands on the cluster
    cli(b, "deploy", str(app))
    try:
        r = call(b, b_token, timeout=8)
        assert r.status_code != 200, r.text
    except httpx.TimeoutException:
        pass  # held by the gateway while its container waits
    pending = wait_until(lambda: [c for c in containers(b, b_token) if c["status"] == "pending"], timeout=30)
    assert "not shared with workspace 'teamb'" in pending[0]["reason"], pending
    assert not [c for c in containers(b, b_token) if c.get("worker_id") == worker]
    # A's cluster's workers are not B's to see: B lists only the platform's
    b_sees = {w["worker_id"] for w in api(b, "GET", "/api/v1/workers", b_token).json()}
    assert worker not in b_sees and b_sees, b_sees
    # nor does B's waiting work make A's cluster start a worker for it (max_workers = 2 would allow one)
    edge_before = edge_workers(env)
    time.sleep(6)  # three passes of the pool controller
    assert edge_workers(env) == edge_before and not [c for c in containers(b, b_token) if c.get("worker_id")]

    cli(env, "clusters", "share", "c1", "--workspace", "teamb")
    listed = json.loads(cli(b, "clusters", "list", "--json").stdout)
    assert [c["name"] for c in listed] == ["c1"] and listed[0]["workspace"] == "default"
    r = call(b, b_token, timeout=120)
    assert r.status_code == 200, r.text
    theirs = [c for c in containers(b, b_token) if c["container_id"] == r.json()["container_id"]]
    assert theirs[0]["worker_id"] == worker and r.json()["secret"] == "of-teamb", r.json()
    assert worker in {w["worker_id"] for w in api(b, "GET", "/api/v1/workers", b_token).json()}  # shared: seen

    # detached: its join token is revoked, its stream cut; the agent dials again, is refused, and exits 2
    cli(env, "clusters", "detach", "c1")
    agent = stack["procs"][1]
    assert wait_until(lambda: agent.poll() is not None, timeout=60) is not None and agent.returncode == 2
    assert "refused this agent's join token" in (stack["home"] / "agent.log").read_text()
    assert stream_status(ws_url, token) in (401, 403)
    assert json.loads(cli(b, "clusters", "list", "--json").stdout) == []
    print(f"attached cluster e2e: {time.monotonic() - t0:.1f} s")
