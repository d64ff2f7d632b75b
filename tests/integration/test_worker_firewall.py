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

from levers9.worker.network import bridge as network
from levers9.worker.network import firewall
from levers9.worker.network.bridge import Ipam, Names

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



# ---- the egress proxy: build steps' and installs' one way out ----------------------------------------

PROBE = """
import json, socket, sys
proxy_host, proxy_port = sys.argv[1].rsplit(":", 1)
out = {}

def ask(head):
    s = socket.create_connection((proxy_host, int(proxy_port)), timeout=5)
    try:
        s.sendall(head)
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return got.decode(errors="replace")
            got += chunk
            if head.startswith(b"CONNECT") and got.startswith(b"HTTP/1.1 200") and b"\\r\\n\\r\\n" in got:
                s.sendall(b"GET / HTTP/1.0\\r\\nHost: index\\r\\n\\r\\n")
                head = b""
    finally:
        s.close()

for name, head in json.loads(sys.argv[2]).items():
    try:
        out[name] = ask(head.encode())
    except OSError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""

INDEX = ("import http.server\nclass H(http.server.BaseHTTPRequestHandler):\n"
         "    def do_GET(self):\n        body = b'index ok ' + self.path.encode()\n        self.send_response(200)\n"
         "        self.send_header('Content-Length', str(len(body)))\n        self.end_headers()\n"
         "        self.wfile.write(body)\n    def log_message(self, *a):\n        pass\n"
         "print('up', flush=True)\nhttp.server.HTTPServer(('0.0.0.0', 8080), H).serve_forever()\n")


@pytest.fixture
def upstream():
    """An 'index' in a namespace of the test's own, on a veth pair of its own (not the bridge)."""
    subprocess.run(["ip", "netns", "add", "l9fwt-up"], check=True)
    subprocess.run(["ip", "link", "add", "l9fwtup0", "type", "veth", "peer", "name", "l9fwtup1"], check=True)
    try:
        for cmd in (["link", "set", "l9fwtup1", "netns", "l9fwt-up"], ["addr", "add", "10.219.8.1/30", "dev", "l9fwtup0"],
                    ["link", "set", "l9fwtup0", "up"], ["-n", "l9fwt-up", "addr", "add", "10.219.8.2/30", "dev", "l9fwtup1"],
                    ["-n", "l9fwt-up", "link", "set", "l9fwtup1", "up"], ["-n", "l9fwt-up", "link", "set", "lo", "up"]):
            subprocess.run(["ip", *cmd], check=True)
        server = subprocess.Popen(["ip", "netns", "exec", "l9fwt-up", sys.executable, "-c", INDEX],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        yield "10.219.8.2"
        server.kill()
        server.wait()
    finally:
        subprocess.run(["ip", "link", "del", "l9fwtup0"], check=False)
        subprocess.run(["ip", "netns", "del", "l9fwt-up"], check=False)


def serve_proxy(proxy, host: str):
    """The proxy on its own loop in a thread; (port, stop)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict = {}

    async def main() -> None:
        box["server"] = await asyncio.start_server(proxy.handle, host, 0)
        started.set()

    threading.Thread(target=lambda: (loop.run_until_complete(main()), loop.run_forever()), daemon=True).start()
    assert started.wait(10)

    def stop() -> None:
        loop.call_soon_threadsafe(box["server"].close)
        loop.call_soon_threadsafe(loop.stop)

    return box["server"].sockets[0].getsockname()[1], stop


def test_only_a_proxied_member_reaches_the_proxy_and_it_reaches_only_allowed_indexes(world, upstream, tmp_path):
    from levers9.worker.network.egress import Endpoint, denied_networks
    from levers9.worker.network.egress_proxy import EgressProxy

    gateway = str(network.bridge_address(SUBNET).ip)
    names = {cid: Names.of(tmp_path, cid) for cid in ("e1", "w1")}
    addresses = {"index.test": [upstream], "other.test": [upstream], "loop.test": ["127.0.0.1"],
                 "bridge.test": [world["ips"]["a1"]]}

    async def resolve(host: str, port: int) -> list[str]:
        return addresses[host]

    allow = {Endpoint(h, 8080) for h in ("index.test", "loop.test", "bridge.test")}
    proxy = EgressProxy(allow, denied_networks(host_addresses(), [SUBNET]), resolve)
    port, stop = serve_proxy(proxy, gateway)
    sentinel = host_listener(0)
    at = f"{gateway}:{port}"
    try:
        async def attach() -> None:
            for cid, n in names.items():
                ip = world["ipam"].claim(cid, tmp_path, n.netns, proxy=at if cid == "e1" else "")
                await network.attach(n, BRIDGE, SUBNET, ip)
            await firewall.sync(BRIDGE, world["ipam"].members)

        asyncio.run(attach())
        asks = {"connect": "CONNECT index.test:8080 HTTP/1.1\r\nHost: index.test:8080\r\n\r\n",
                "plain": "GET http://index.test:8080/simple/ HTTP/1.1\r\nHost: index.test\r\nProxy-Connection: keep-alive\r\n\r\n",
                "not allowed": "CONNECT other.test:8080 HTTP/1.1\r\n\r\n",
                "to loopback": "CONNECT loop.test:8080 HTTP/1.1\r\n\r\n",
                "to a container": "CONNECT bridge.test:8080 HTTP/1.1\r\n\r\n",
                "origin form": "GET /simple/ HTTP/1.1\r\nHost: index.test\r\n\r\n"}
        got = json.loads(subprocess.run(["ip", "netns", "exec", names["e1"].netns, sys.executable, "-c", PROBE, at,
                                         json.dumps(asks)], capture_output=True, text=True, timeout=60,
                                        check=True).stdout)
        assert "index ok /" in got["connect"], got
        assert "index ok /simple/" in got["plain"], got
        for refused in ("not allowed", "to loopback", "to a container"):
            assert got[refused].startswith("HTTP/1.1 403"), got
        assert got["origin form"].startswith("HTTP/1.1 405"), got
        # the proxied member reaches nothing else of the host, nor the index directly
        direct = in_ns(names["e1"].netns, [f"{gateway}:{sentinel.getsockname()[1]}", f"{upstream}:8080"])
        assert "connected" not in direct.values(), direct
        # a workload (no proxy in its claim) does not reach the proxy
        assert in_ns(names["w1"].netns, [at]) != {at: "connected"}
    finally:
        stop()
        sentinel.close()

        async def detach() -> None:
            for cid, n in names.items():
                await network.detach(n)
                world["ipam"].release_owned(cid, tmp_path)

        asyncio.run(detach())


def test_the_bridge_keeps_its_own_mac_as_ports_come_and_go(world):
    """A bridge given no address takes the lowest MAC of its ports: a container (of any worker)
    joining with a lower one changed it, and the others' ARP caches pointed at a port, not the host,
    for ~30 s (their answers to the gateway were retransmitted into nothing). Ours keeps a set one."""
    from levers9.runtime.bridge_mac import bridge_mac

    def mac() -> str:
        return json.loads(subprocess.run(["ip", "-j", "link", "show", "dev", BRIDGE], capture_output=True,
                                         text=True, check=True).stdout)[0]["address"]

    assert mac() == bridge_mac(BRIDGE)
    low, peer = "l9fwtlow0", "l9fwtlow1"
    subprocess.run(["ip", "link", "add", low, "address", "02:00:00:00:00:01", "type", "veth", "peer", "name", peer],
                   check=True)
    try:
        subprocess.run(["ip", "link", "set", low, "master", BRIDGE], check=True)
        subprocess.run(["ip", "link", "set", low, "up"], check=True)
        assert mac() == bridge_mac(BRIDGE), "a port with a lower MAC joined and the bridge took its MAC"
    finally:
        subprocess.run(["ip", "link", "del", low], check=False)
    assert mac() == bridge_mac(BRIDGE)
    asyncio.run(network.ensure_bridge(BRIDGE, SUBNET))  # again, as each worker's start does: no change
    assert mac() == bridge_mac(BRIDGE)
