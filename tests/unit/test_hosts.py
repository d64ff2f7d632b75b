"""Workers as hosts, the pure parts: host plans (levers9.runtime.hosts), the underlay's rules, the
URLs a host's worker gets, the published container ports (levers9.worker.network.hosts) and their DNAT in
the container firewall, and what the netns pool backend starts (with the host-making stubbed out)."""

from __future__ import annotations

import importlib
import ipaddress
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.runtime import hosts
from levers9.runtime.config import Settings
from levers9.worker.checkpoints.orchestration import peer_of
from levers9.worker.network import firewall
from levers9.worker.network.bridge import Ipam
from levers9.worker.network.hosts import container_address, published_port

SUBNET, SUPERNET = "10.210.0.0/24", "10.209.0.0/16"
LOCAL_BRIDGE = ipaddress.IPv4Network("10.209.0.0/24")  # the plain local worker's bridge_subnet


# ---- host plans ----------------------------------------------------------------------------------

@given(st.sets(st.integers(1, hosts.capacity(SUBNET, SUPERNET)), min_size=2, max_size=30))
def test_hosts_never_share_an_address_a_subnet_or_a_name(indices):
    plans = [hosts.host_plan(n, SUBNET, SUPERNET) for n in indices]
    gw = hosts.gateway_of(SUBNET)
    nets = [ipaddress.IPv4Network(p.container_subnet) for p in plans]
    for i, (p, net) in enumerate(zip(plans, nets)):
        assert ipaddress.IPv4Address(p.address) in ipaddress.IPv4Network(SUBNET) and p.address != str(gw)
        assert p.gateway == str(gw)
        assert not net.overlaps(LOCAL_BRIDGE) and not net.overlaps(ipaddress.IPv4Network(SUBNET))
        assert net.subnet_of(ipaddress.IPv4Network(SUPERNET))
        assert all(len(name) <= 15 for name in (p.netns, p.outer_veth, p.inner_veth, p.bridge))
        assert hosts.index_of(p.netns) == p.index
        for q, other in zip(plans[i + 1:], nets[i + 1:]):
            assert p.address != q.address and not net.overlaps(other)
            assert {p.netns, p.outer_veth, p.inner_veth, p.bridge}.isdisjoint(
                {q.netns, q.outer_veth, q.inner_veth, q.bridge})


@given(st.sets(st.integers(1, 40)))
def test_free_index_is_the_lowest_untaken(taken):
    n = hosts.free_index(taken, SUBNET, SUPERNET)
    assert n not in taken and all(k in taken for k in range(1, n))


def test_full_subnets_say_so_and_plans_outside_refuse():
    small = "10.210.0.0/29"  # gateway .1, hosts .2-.6
    assert hosts.capacity(small, SUPERNET) == 5
    with pytest.raises(hosts.HostsError, match="no room for another host"):
        hosts.free_index(range(1, 6), small, SUPERNET)
    with pytest.raises(hosts.HostsError, match="does not fit"):
        hosts.host_plan(0, SUBNET, SUPERNET)  # 0 is the local bridge's /24
    assert hosts.index_of("l9-abc") is None and hosts.index_of("l9h-7") == 7


# ---- what a host's worker is told ----------------------------------------------------------------

@given(st.sampled_from(["127.0.0.1", "localhost"]), st.integers(1, 65535), st.sampled_from(
    ["nats://", "tls://", "http://", "postgresql://postgres@", ""]), st.sampled_from(["", "/levers9", "/a/b?x=1"]))
def test_loopback_urls_go_to_the_underlay_keeping_everything_else(host, port, prefix, path):
    url = f"{prefix}{host}:{port}{path if prefix else ''}"
    out = hosts.rewrite_url(url, "10.210.0.1")
    assert out == f"{prefix}10.210.0.1:{port}{path if prefix else ''}"


def test_other_hosts_are_left_alone_and_only_loopback_ports_are_published():
    assert hosts.rewrite_url("nats://nats.example:4222", "10.210.0.1") == "nats://nats.example:4222"
    assert hosts.rewrite_url("", "10.210.0.1") == ""
    assert hosts.published_ports(["nats://127.0.0.1:4222", "http://s3.example:9000", "127.0.0.1:5000",
                                  "postgresql://postgres@127.0.0.1:5432/levers9", ""]) == [4222, 5000, 5432]


def test_a_hosts_worker_gets_no_loopback_url_and_its_own_bridge(tmp_path):
    plan = hosts.host_plan(3, SUBNET, SUPERNET)
    urls = {"nats_url": "nats://127.0.0.1:4222", "database_url": "postgresql://postgres@127.0.0.1:5432/levers9",
            "s3_endpoint": "http://127.0.0.1:8333", "registry": "127.0.0.1:5000", "gateway_url": "http://127.0.0.1:8080"}
    env = hosts.host_env(plan, urls, SUBNET, tmp_path)
    assert not [v for v in env.values() if "127.0.0.1" in v or "localhost" in v]
    assert env["LEVERS9_NATS_URL"] == "nats://10.210.0.1:4222" and env["LEVERS9_REGISTRY"] == "10.210.0.1:5000"
    assert env["LEVERS9_HTTP_HOST"] == env["LEVERS9_HOST_ADDRESS"] == "10.210.0.4"
    assert env["LEVERS9_BRIDGE_SUBNET"] == "10.209.3.0/24" and env["LEVERS9_BRIDGE_NAME"] == "l9hbr3"
    assert env["LEVERS9_CACHE_DIR"].startswith(str(tmp_path))
    settings = Settings.load(env=env, profile=tmp_path / "none.toml")  # the names are real settings
    assert settings.network.host_address == "10.210.0.4" and settings.images.cache_dir == env["LEVERS9_CACHE_DIR"]


def test_the_underlay_publishes_only_the_given_ports_and_drops_the_rest():
    script = hosts.underlay_ruleset("levers9hosts", "10.210.0.1", [4222, 5432, 4222])
    assert 'iifname "levers9hosts" ip daddr 10.210.0.1 tcp dport { 4222, 5432 } dnat ip to 127.0.0.1' in script
    chain = script.split("chain input", 1)[1].split("}", 1)[0]
    assert chain.strip().splitlines()[-1].strip() == 'iifname "levers9hosts" drop'
    assert script.startswith("table ip levers9_levers9hosts\ndelete table ip levers9_levers9hosts\n")
    assert "dnat" not in hosts.underlay_ruleset("levers9hosts", "10.210.0.1", []).split("chain input")[0]
    with pytest.raises(hosts.HostsError):
        hosts.underlay_ruleset('x"; flush ruleset', "10.210.0.1", [1])


# ---- containers published on the host ------------------------------------------------------------

@given(st.sampled_from(["10.209.1.0/24", "10.209.7.0/24", "10.209.8.0/28"]), st.integers(1024, 40000))
def test_published_ports_are_one_per_container_address(subnet, base):
    net = ipaddress.IPv4Network(subnet)
    ports = [published_port(subnet, str(ip), base) for ip in net.hosts()]
    assert len(set(ports)) == len(ports) and all(base < p <= base + net.num_addresses for p in ports)


def test_the_address_is_the_hosts_when_the_worker_is_a_host():
    assert container_address("", "10.209.0.0/24", "10.209.0.5", 8000, 20000) == "http://10.209.0.5:8000"
    assert container_address("10.210.0.3", "10.209.2.0/24", "10.209.2.5", 8000, 20000) == "http://10.210.0.3:20005"
    with pytest.raises(ValueError, match="not in the bridge subnet"):
        published_port("10.209.2.0/24", "10.209.3.5", 20000)


def test_dnat_comes_only_with_a_host_and_never_from_the_bridge():
    plain = firewall.ruleset("l9hbr1", [firewall.Member("l9habc")])
    assert "dnat" not in plain and "nat hook" not in plain  # a plain worker's rules are unchanged
    fwd = [firewall.Forward(20002, "10.209.1.2", 8000)]
    script = firewall.ruleset("l9hbr1", [firewall.Member("l9habc")], forwards=fwd, host_address="10.210.0.2")
    assert 'iifname != "l9hbr1" ip daddr 10.210.0.2 tcp dport 20002 dnat ip to 10.209.1.2:8000' in script
    assert "type nat hook output" in script  # the worker's own health checks take the same way
    forward = script.split("chain forward", 1)[1].split("}", 1)[0].strip().splitlines()
    assert forward[1].strip() == "ct status dnat accept"  # before anything from the bridge is dropped
    assert 'iifname "l9hbr1" drop' in script  # a container's own connections out are still dropped
    deny = firewall.ruleset("b", [], egress=firewall.parse_egress("0.0.0.0/0"),
                            deny=firewall.parse_egress("10.210.0.0/24"))
    assert deny.index("ip daddr 10.210.0.0/24 drop") < deny.index("ip daddr 0.0.0.0/0 accept")


def test_claims_carry_the_port_to_the_forwards(tmp_path):
    ipam = Ipam("l9hbr1", "10.209.1.0/24", root=tmp_path)
    a = ipam.claim("c1", tmp_path, "l9-aaaa", port=8000)
    ipam.claim("c2", tmp_path, "l9-bbbb")  # no port: nothing published
    assert ipam.forwards(20000) == [firewall.Forward(published_port("10.209.1.0/24", a, 20000), a, 8000)]
    ipam.release_owned("c1", tmp_path)
    assert ipam.forwards(20000) == []


def test_a_restore_fills_from_the_node_that_dumped_it():
    loc = "http://10.210.0.2:2050/blobs/" + "a" * 64
    assert peer_of(loc, "http://10.210.0.3:2050") == "http://10.210.0.2:2050"
    assert peer_of(loc, "http://10.210.0.2:2050") == ""  # its own cache: no peer
    assert peer_of("", "http://10.210.0.3:2050") == "" and peer_of("s3://b/k", "http://x:1") == ""


# ---- the backend ---------------------------------------------------------------------------------

def test_the_netns_backend_runs_the_worker_in_its_host_with_underlay_urls(tmp_path, monkeypatch):
    mod = importlib.import_module("levers9.pool_controller.backends_netns")
    made: list[str] = []
    monkeypatch.setattr(hosts, "ensure_underlay", lambda bridge, subnet, urls, owner="": made.append(f"underlay {bridge}"))
    monkeypatch.setattr(hosts, "add_host", lambda bridge, subnet, sup, markers: hosts.host_plan(2, subnet, sup))
    monkeypatch.setattr(hosts, "remove_host", lambda plan: made.append(f"removed {plan.netns}"))
    settings = Settings().with_(home=str(tmp_path), nats_url="nats://127.0.0.1:4222", gateway_url="http://127.0.0.1:9")
    backend = mod.NetnsBackend(tmp_path, settings=settings)
    cmd, env = backend.where("w1", ["python", "-m", "levers9"], {"LEVERS9_HTTP_HOST": "127.0.0.1"})
    assert cmd[:3] == ["nsenter", "--net=/run/netns/l9h-2", "--"] and cmd[3:] == ["python", "-m", "levers9"]
    assert env["LEVERS9_NATS_URL"] == "nats://10.210.0.1:4222" and env["LEVERS9_HTTP_HOST"] == "10.210.0.3"
    assert not re.search(r"127\.0\.0\.1", " ".join(env.values()))

    class Done:
        def poll(self):
            return 0
    backend.procs["w1"] = Done()  # type: ignore[assignment]
    assert backend.exited() == ["w1"] and made == ["underlay levers9hosts", "removed l9h-2"]
    assert backend.host_of("w1") is None and Path(backend.markers).name == "live"


# ---- the gateway: a container re-requested on another host ----------------------------------------

def test_a_re_requested_container_gets_a_fresh_slot_at_its_new_address():
    import asyncio

    from levers9.gateway.router import DeploymentRouter

    async def go():
        router = DeploymentRouter("d", concurrency=1, max_containers=1)
        await router.update("c1", "ready", "http://10.210.0.2:20002")
        stuck = await router.acquire(1, lambda: asyncio.sleep(0, "x"))  # a call hung on the cut-off host
        await router.update("c1", "requested")  # its worker was lost
        await router.update("c1", "ready", "http://10.210.0.3:20002")
        fresh = await router.acquire(1, lambda: asyncio.sleep(0, "x"))
        assert fresh.address == "http://10.210.0.3:20002" and fresh is not stuck
        await router.release(stuck)  # the hung call ends: the new slot is not touched
        assert fresh.inflight == 1
        await router.update("c1", "ready", "http://10.210.0.3:20002")  # a repeated event keeps the slot
        assert router.containers["c1"] is fresh

    asyncio.run(go())


def test_two_homes_on_one_underlay_keep_each_others_published_ports(tmp_path, monkeypatch):
    """The underlay's table is rebuilt whole: each home's ports are registered, and the rules carry
    every home's (a second home's `up` used to drop the first's NATS and Postgres ports)."""
    from levers9.runtime import hosts as H

    monkeypatch.setattr(H, "PORTS_DIR", tmp_path)
    a, b = tmp_path / "home-a" / "hosts" / "live", tmp_path / "home-b" / "hosts" / "live"
    assert H.register_ports("levers9hosts", a, [4222, 5432]) == [4222, 5432]
    assert H.register_ports("levers9hosts", b, [4333, 8080]) == [4222, 4333, 5432, 8080]
    assert H.register_ports("levers9hosts", a, [4222, 5432, 9000]) == [4222, 4333, 5432, 8080, 9000]
    assert H.register_ports("levers9hosts", a, None) == [4333, 8080]  # home a torn down
    assert H.register_ports("otherbr", a, [1]) == [1]  # per bridge
    rules = H.underlay_ruleset("levers9hosts", "10.210.0.1", H.register_ports("levers9hosts", b, [4333, 8080]))
    assert "tcp dport { 4333, 8080 } dnat ip to 127.0.0.1" in rules
