"""The dashboard end to end, without a browser: its own `levers9 up` (the dashboard is its seventh
process), signed in through `levers9 dashboard`'s one-time link, watching a real deploy and cold
start on `/events`, reading the overview, the container's waterfall and the correlation chain,
stopping the deployment with the CSRF header, `/mcp` through the SDK's own client, and another
workspace's ids answering 404 through it; `levers9 down` stops it."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from pathlib import Path

import httpx
import pytest
from _e2e import api, bus_auth, cli, needs_runc, one_worker_stack, wait_until

pytestmark = pytest.mark.slow
needs_runc()

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with one_worker_stack(tmp_path_factory.mktemp("dashboard-home"), 4000, 4096) as e:
        yield e


def dashboard_url(env: dict) -> str:
    comps = json.loads(cli(env, "status", "--json").stdout)["components"]
    entry = next(c for c in comps if c["name"] == "dashboard")
    assert entry["healthy"] and entry["url"].startswith("http://"), entry
    return entry["url"]


def browser(env: dict) -> httpx.Client:
    link = json.loads(cli(env, "dashboard", "--json").stdout)["url"]
    c = httpx.Client(base_url=link.split("/signin")[0], trust_env=False, timeout=60)
    r = c.get(link)
    assert r.status_code == 303, r.text
    c.headers["X-CSRF-Token"] = c.cookies["levers9_csrf"]
    return c


class Listener(threading.Thread):
    """An /events stream read in a thread, as a browser's EventSource would."""

    def __init__(self, client: httpx.Client) -> None:
        super().__init__(daemon=True)
        self.client, self.events, self.opened = client, [], threading.Event()
        self.stop = False

    def run(self) -> None:
        with self.client.stream("GET", "/events", timeout=httpx.Timeout(60, read=None)) as r:
            assert r.status_code == 200
            self.opened.set()
            for line in r.iter_lines():
                if self.stop:
                    return
                if line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]


def other_workspace_token(env: dict) -> str:
    from levers9.cli import publish_token

    nats = next(c["url"] for c in json.loads(cli(env, "status", "--json").stdout)["components"] if c["name"] == "nats")
    token = "l9_" + uuid.uuid4().hex
    asyncio.run(publish_token(nats, token, "dashboard-other", workspace="dash-other", auth=bus_auth(env)))
    gateway = json.loads(cli(env, "status", "--json").stdout)["gateway_url"]
    wait_until(lambda: httpx.get(f"{gateway}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"},
                                 timeout=10, trust_env=False).status_code == 200, timeout=60)
    return token


def test_sign_in_watch_a_deploy_and_its_cold_start_then_stop_it(env):
    url = dashboard_url(env)
    c = browser(env)
    assert c.get("/api/me").json()["workspace"] == "default"
    listener = Listener(c)
    listener.start()
    assert listener.opened.wait(30)
    cli(env, "deploy", str(ROOT / "examples" / "hello.py"))
    r = api(env, "POST", "/endpoint/hello", json={"name": "dashboard"})
    assert r.json() == {"message": "hello, dashboard"}
    wait_until(lambda: {"DeploymentCreated", "ContainerRequested", "ContainerReady"} <= set(listener.types()), timeout=120)
    seqs = [e["seq"] for e in listener.events]
    assert seqs == sorted(set(seqs))  # in order, never twice
    assert all(e["workspace"] in ("default", "_sys") for e in listener.events)

    overview = c.get("/api/overview").json()
    assert "hello" in [d["name"] for d in overview["deployments"]]
    assert overview["containers"]["live"] >= 1 and overview["pools"]
    [container] = [x for x in c.get("/api/v1/containers").json() if x.get("deployment_name") == "hello"]
    w = c.get(f"/api/containers/{container['container_id']}/waterfall").json()
    names = [p["name"] for p in w["phases"]]
    assert names[:2] == ["requested", "placed"] and names[-1] == "ready" and ("started" in names or "restored" in names)
    assert w["kind"] in ("cold", "restored", "shared checkpoint")
    chain = c.get(f"/api/chain/{container['correlation_id']}").json()
    assert chain["count"] >= 4 and chain["roots"]

    stopped = c.post("/api/deployments/hello/stop", headers={"Origin": url})
    assert stopped.status_code == 200, stopped.text
    refused = c.post("/api/deployments/hello/stop", headers={"Origin": "https://evil.example"})
    assert refused.status_code == 403
    wait_until(lambda: "DeploymentStopped" in listener.types(), timeout=60)
    listener.stop = True

    # another workspace's token, through the dashboard: the container is not there
    other = httpx.Client(base_url=url, trust_env=False, timeout=60,
                         headers={"Authorization": f"Bearer {other_workspace_token(env)}"})
    for path in (f"/api/v1/containers/{container['container_id']}", f"/api/containers/{container['container_id']}/waterfall",
                 f"/api/chain/{container['correlation_id']}"):
        assert other.get(path).status_code == 404, path
    assert c.get("/no/such/page").status_code == 404


def test_mcp_with_the_sdk_client(env):
    import tomllib

    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    url = dashboard_url(env)
    token = tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())["token"]

    async def talk() -> tuple[set[str], str]:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, trust_env=False, timeout=60) as http, \
                streamable_http_client(f"{url}/mcp", http_client=http) as (read, write), \
                ClientSession(read, write) as s:
            await s.initialize()
            tools = {t.name for t in (await s.list_tools()).tools}
            listed = await s.call_tool("list_deployments", {})
            return tools, json.dumps(listed.structured_content)

    tools, listed = asyncio.run(talk())
    assert {"list_deployments", "explain_cold_start", "stop_deployment"} <= tools
    assert "hello" in listed


def test_down_stops_the_dashboard(env):
    """The module's last test: the fixture's own `down` after it finds nothing left to stop."""
    url = dashboard_url(env)
    cli(env, "down")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/healthz", timeout=2, trust_env=False)
