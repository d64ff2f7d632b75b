"""The worker's firewall on a real bridge with real network namespaces (root, ip, nft; no runc).

A bridge of its own (`l9fwt0`, 10.219.7.0/28) with three namespaces attached the way the worker
attaches containers: a1 and a2 of workspace acme, b1 of workspace other (policy "workspace", so the
peer rules are exercised both ways). The same probes run with the rules and without them: without,
everything connects (so the probes can see a success); with, only what the rules allow does.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from levers9.worker import firewall, network
from levers9.worker.network import Ipam, Names

BRIDGE, SUBNET = "l9fwt0", "10.219.7.0/28"

if os.geteuid() != 0 or not shutil.which("ip") or firewall.nft_missing():
    pytest.skip("the firewall needs root, ip and nft (scripts/setup.sh installs nftables)", allow_module_level=True)

CONNECT = """
import json, socket, sys
out = {}
for target in json.loads(sys.argv[1]):
    host, port = target.rsplit(":", 1)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect((host.strip("[]"), int(port)))
        out[target] = "connected"
    except OSError as exc:
        out[target] = type(exc).__name__
    finally:
        s.close()
print(json.dumps(out))
"""

LISTEN = "import socket,sys,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n" \
         "s.bind(('0.0.0.0',int(sys.argv[1])))\ns.listen(64)\nprint('up',flush=True)\n" \
         "while True:\n    c,_=s.accept()\n    c.close()\n"


def in_ns(ns: str, targets: list[str]) -> dict[str, str]:
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", CONNECT, json.dumps(targets)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out)


def host_listener(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)  # dual stack: every host address, v4 and v6
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("::", port))
    s.listen(64)

    def accept() -> None:
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return s


def host_addresses() -> list[str]:
    """This machine's own IPv4 addresses (packets to them never leave it)."""
    doc = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True).stdout)
    return [a["local"] for link in doc for a in link.get("addr_info", []) if not a["local"].startswith("127.")]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fw")
    ipam = Ipam(BRIDGE, SUBNET, root=tmp / "ipam")
    names = {cid: Names.of(tmp, cid) for cid in ("a1", "a2", "b1")}
    groups = {"a1": "w:acme", "a2": "w:acme", "b1": "w:other"}
    ips: dict[str, str] = {}
    listeners: list[subprocess.Popen] = []

    async def setup() -> None:
        await network.ensure_bridge(BRIDGE, SUBNET)
        for cid, n in names.items():
            ips[cid] = ipam.claim(cid, tmp, n.netns, group=groups[cid])
            await network.attach(n, BRIDGE, SUBNET, ips[cid])

    try:
        asyncio.run(setup())
        for n in names.values():
            p = subprocess.Popen(["ip", "netns", "exec", n.netns, sys.executable, "-c", LISTEN, "7000"],
                                 stdout=subprocess.PIPE, text=True)
            listeners.append(p)
            assert p.stdout is not None and p.stdout.readline().strip() == "up"
        yield {"ipam": ipam, "names": names, "ips": ips}
    finally:
        for p in listeners:
            p.kill()
            p.wait()

        async def teardown() -> None:
            await firewall.remove(BRIDGE)
            for n in names.values():
                await network.detach(n)
            await network.ip("link", "del", BRIDGE, check=False)

        asyncio.run(teardown())


def test_the_rules_keep_containers_off_the_host_and_other_workspaces(world):
    ips, names = world["ips"], world["names"]
    gateway = str(network.bridge_address(SUBNET).ip)
    listener = host_listener(0)
    port = listener.getsockname()[1]
    try:
        to_host = [f"{gateway}:{port}", *(f"{a}:{port}" for a in host_addresses() if a != gateway)]
        probes = [*to_host, f"{ips['a2']}:7000", f"{ips['b1']}:7000"]

        asyncio.run(firewall.remove(BRIDGE))  # without rules: everything answers (the probes work)
        open_ = in_ns(names["a1"].netns, probes)
        assert set(open_.values()) == {"connected"}, open_

        asyncio.run(firewall.sync(BRIDGE, world["ipam"].members))
        asyncio.run(firewall.sync(BRIDGE, world["ipam"].members))  # again: idempotent
        closed = in_ns(names["a1"].netns, probes)
        assert all(closed[t] != "connected" for t in to_host), closed  # no host address answers
        assert closed[f"{ips['b1']}:7000"] != "connected", closed  # another workspace's container
        assert closed[f"{ips['a2']}:7000"] == "connected", closed  # its peer under policy "workspace"
        assert in_ns(names["b1"].netns, [f"{ips['a1']}:7000"]) != {f"{ips['a1']}:7000": "connected"}
        # the host still reaches every container (the gateway's proxy, the worker's readiness checks)
        for ip in ips.values():
            socket.create_connection((ip, 7000), timeout=5).close()
    finally:
        listener.close()

