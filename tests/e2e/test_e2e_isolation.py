"""Containers are isolated, end to end: a hostile handler (apps/hostile.py) in workspace `default`
tries to reach every port of the control plane (from `levers9 status` and every TCP listener of the
stack's processes) on the container's loopback, the bridge's host address and the host's other
addresses, and a container of workspace `other`; and tries mount, namespaces, keyrings, ptrace,
capabilities, raw sockets, /proc/sys, /sys, masked /proc files, the pids and the memory limit.
Nothing may work. Controls: a listener the test opens on every host address (it would answer
without the firewall), the handler's own loopback, work under the limits, and the gateway still
reaching both containers. The lane's shared stack (`shared_env`, runc, root)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import threading
import tomllib
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from _e2e import cli, needs_runc, wait_until

try:  # the home's admin credentials on the bus (NATS with auth)
    from _e2e import bus_auth
except ImportError:  # a bus without credentials
    bus_auth = None

from levers9.runtime.config import Settings
from levers9.worker.network.bridge import bridge_address

pytestmark = pytest.mark.slow
needs_runc()

APPS = Path(__file__).parent / "apps"


@pytest.fixture(scope="module")
def env(shared_env):
    return shared_env


def api(env: dict, method: str, path: str, token: str | None = None, **kw) -> httpx.Response:
    """A gateway call with `token` (default: the profile's, workspace `default`)."""
    p = tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())
    return httpx.request(method, p["gateway_url"] + path, headers={"Authorization": f"Bearer {token or p['token']}"},
                         timeout=kw.pop("timeout", 180), **kw)


def stack_ports(env: dict) -> dict[str, int]:
    """Where the stack listens: its components' URLs, and every TCP listener of its processes."""
    doc = json.loads(cli(env, "status", "--json").stdout)
    ports: dict[str, int] = {}
    for c in doc["components"]:
        port = urlsplit(c["url"] if "://" in c["url"] else f"//{c['url']}").port if c["url"] else None
        if port:
            ports[c["name"]] = port
    home = env["LEVERS9_HOME"]
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.pid:
            continue
        try:
            proc = psutil.Process(conn.pid)
            mine = proc.environ().get("LEVERS9_HOME") == home or home in " ".join(proc.cmdline())
        except (psutil.Error, OSError):
            continue
        if mine:
            cmd = proc.cmdline()
            role = cmd[-1] if cmd[-3:-1] == ["levers9", "service"] else proc.name()
            ports[f"{role}[{conn.pid}] {conn.laddr.ip}:{conn.laddr.port}"] = conn.laddr.port
    return ports


def host_addresses() -> list[str]:
    doc = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True).stdout)
    return sorted({a["local"] for link in doc for a in link.get("addr_info", [])} - {"127.0.0.1"})


def sentinel() -> socket.socket:
    """A listener on every host address (v4 and v6): the control that a probe would get through."""
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", 0))
    s.listen(16)

    def accept() -> None:
        while True:
            try:
                s.accept()[0].close()
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return s


def other_workspace(env: dict) -> dict:
    """A profile for workspace `other` (its own token), for the CLI and the API."""
    from levers9.cli import publish_token

    nats = next(c["url"] for c in json.loads(cli(env, "status", "--json").stdout)["components"] if c["name"] == "nats")
    token = "l9_" + uuid.uuid4().hex
    auth = {"auth": bus_auth(env)} if bus_auth is not None else {}
    asyncio.run(publish_token(nats, token, "isolation", workspace="other", **auth))
    other = {**env, "LEVERS9_TOKEN": token}
    wait_until(lambda: api(other, "GET", "/api/v1/whoami", token, timeout=10).status_code == 200, timeout=60)
    return {"env": other, "token": token}


def test_a_hostile_container_reaches_nothing(env):
    other = other_workspace(env)
    cli(other["env"], "deploy", str(APPS / "hostile_peer.py"))
    peer = api(env, "POST", "/endpoint/peer", json={}, token=other["token"])
    assert peer.status_code == 200, peer.text
    peer_at = f"{peer.json()['ip']}:{peer.json()['port']}"
    cli(env, "deploy", str(APPS / "hostile.py"))

    bridge = str(bridge_address(Settings.load(env).network.bridge_subnet).ip)
    listener = sentinel()
    try:
        ports = stack_ports(env)
        ports["test sentinel"] = listener.getsockname()[1]
        assert {"nats", "s3", "registry", "gateway"} <= set(ports), ports
        # the worker's HTTP and executor relay, the gateway's HTTP and gRPC, at least
        assert sum(k.startswith("worker[") for k in ports) >= 2, ports
        assert sum(k.startswith("gateway[") for k in ports) >= 2, ports
        addresses = sorted({"127.0.0.1", bridge, *host_addresses()})
        targets = [f"{a}:{p}" for a in addresses for p in sorted(set(ports.values()))] + [peer_at]
        r = api(env, "POST", "/endpoint/hostile", json={"targets": targets, "memory_mib": 512, "pids_limit": 4096},
                timeout=300)
        assert r.status_code == 200, r.text
        report = r.json()
    finally:
        listener.close()
    print(json.dumps({"ports": ports, "addresses": addresses, **report}, indent=1))
    assert report["succeeded"] == [], report["results"]
    assert {f"tcp {t}" for t in targets} <= set(report["results"])
    # the controls: the probes can see success, and the limits leave room for ordinary work
    assert report["controls"] == {"own loopback": "connected", "threads under the limit": 64,
                                  "allocate under the limit": "worked", "ordinary syscall in a child": "worked"}
    assert report["results"]["allocate past the memory limit"] == "killed by SIGKILL"
    assert report["results"]["threads past the pids limit"].startswith("refused after")
    # the gateway still reaches both containers
    assert api(env, "POST", "/endpoint/peer", json={}, token=other["token"]).status_code == 200
    assert api(env, "POST", "/endpoint/hostile", json={"targets": []}, timeout=300).json()["succeeded"] == []
    # workspace `other`'s peer goes with the test: its container would hold the shared stack's worker
    # for its keep-warm, which the next module's reset (workspace `default` only) waits out
    assert api(env, "DELETE", "/api/v1/deployments/peer", token=other["token"]).status_code == 200
