"""Workers as hosts on one machine: each worker in its own network namespace, joined to an underlay.

The pool backend `netns` (levers9.pool_controller.backends_netns) makes, for each worker, a host:
a network namespace `l9h-<n>` with one veth into the underlay bridge (`hosts_bridge`, host side the
first address of `hosts_subnet`, e.g. 10.210.0.1), the address `hosts_subnet`+1+n, a default route
via the host side, and IP forwarding on (its containers are published through it). The worker runs
in that namespace only (its mounts stay the machine's: `nsenter --net`, never `ip netns exec`).

- Its containers get their own bridge `l9hbr<n>` on the n-th /24 of `hosts_container_supernet`
  (10.209.<n>.0/24; n >= 1, so never the plain local bridge's 10.209.0.0/24): bridges never clash.
- The control plane (NATS, Postgres, S3, the registry, the gateway) listens on 127.0.0.1 only. For
  the hosts, exactly the ports of those URLs are forwarded from the underlay's host address to
  loopback (nftables DNAT, `route_localnet` on the underlay bridge alone); everything else a host
  sends to this machine is dropped, so loopback-only services stay unreachable from the hosts. The
  worker is given the URLs with the host address, never 127.0.0.1 (`host_env`).
- Hosts reach each other over the underlay (a node cache filling from a peer's); the gateway reaches a
  host's containers at `host_address:port` (DNAT inside the host: levers9.worker.network.firewall).

Pure parts first (plans, URLs, the nft script), then the ip(8)/nft(8) shell. Everything is undone by
`remove_host` and `teardown` (`levers9 down`).
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from .bridge_mac import bridge_mac

NETNS_DIR = Path("/run/netns")
LOCK = Path("/run/levers9/hosts.lock")
PORTS_DIR = Path("/run/levers9/underlay")  # <bridge>/<owner>.ports: what each home publishes on it
PREFIX = "l9h-"
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
URL_KEYS = ("nats_url", "database_url", "s3_endpoint", "registry", "gateway_url")


class HostsError(RuntimeError):
    pass


# ---- pure ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostPlan:
    """Names and addresses of host n (n >= 1); kernel names stay within 15 characters."""
    index: int
    netns: str
    address: str  # on the underlay, e.g. 10.210.0.2
    prefixlen: int
    gateway: str  # the underlay's host side, e.g. 10.210.0.1
    outer_veth: str  # in the machine's namespace, enslaved to the underlay bridge
    inner_veth: str  # moved into the host and renamed eth0
    bridge: str  # the host's container bridge (inside the host)
    container_subnet: str


def gateway_of(hosts_subnet: str) -> ipaddress.IPv4Address:
    net = ipaddress.IPv4Network(hosts_subnet, strict=True)
    if net.num_addresses < 4:
        raise HostsError(f"hosts_subnet {hosts_subnet} is too small (at least /30)")
    return net.network_address + 1


def capacity(hosts_subnet: str, supernet: str) -> int:
    """How many hosts fit: addresses after the gateway, and /24s of the supernet after the first."""
    net = ipaddress.IPv4Network(hosts_subnet, strict=True)
    sup = ipaddress.IPv4Network(supernet, strict=True)
    subnets = 2 ** max(0, 24 - sup.prefixlen) if sup.prefixlen <= 24 else 0
    return max(0, min(net.num_addresses - 3, subnets - 1))


def host_plan(index: int, hosts_subnet: str, supernet: str) -> HostPlan:
    if not 1 <= index <= capacity(hosts_subnet, supernet):
        raise HostsError(f"host {index} does not fit hosts_subnet {hosts_subnet} / {supernet} "
                         f"({capacity(hosts_subnet, supernet)} hosts at most)")
    net = ipaddress.IPv4Network(hosts_subnet, strict=True)
    sup = ipaddress.IPv4Network(supernet, strict=True)
    container = ipaddress.IPv4Network((int(sup.network_address) + (index << 8), 24))
    gw = gateway_of(hosts_subnet)
    return HostPlan(index=index, netns=f"{PREFIX}{index}", address=str(gw + index), prefixlen=net.prefixlen,
                    gateway=str(gw), outer_veth=f"l9u{index}", inner_veth=f"l9d{index}", bridge=f"l9hbr{index}",
                    container_subnet=str(container))


def index_of(netns: str) -> int | None:
    m = re.fullmatch(rf"{PREFIX}(\d+)", netns)
    return int(m.group(1)) if m else None


def free_index(taken: Iterable[int], hosts_subnet: str, supernet: str) -> int:
    """The lowest host number not taken; HostsError when the subnets are full."""
    used = set(taken)
    for n in range(1, capacity(hosts_subnet, supernet) + 1):
        if n not in used:
            return n
    raise HostsError(f"no room for another host in {hosts_subnet} / {supernet}: stop a worker or widen them")


def _split_host(netloc: str) -> tuple[str, str, str]:
    """netloc -> (userinfo@, host, :port)."""
    user, _, rest = netloc.rpartition("@")
    m = re.fullmatch(r"(\[[^\]]*\]|[^:]*)(:\d+)?", rest)
    host, port = (m.group(1), m.group(2) or "") if m else (rest, "")
    return (f"{user}@" if user else ""), host, port


def rewrite_url(url: str, gateway: str) -> str:
    """`url` with a loopback host replaced by the underlay's host side (others are left alone);
    works for scheme URLs and for `host:port` (the registry)."""
    if not url:
        return url
    if "://" not in url:
        user, host, port = _split_host(url)
        return f"{user}{gateway}{port}" if host in LOOPBACK else url
    scheme, rest = url.split("://", 1)
    netloc, sep, tail = rest.partition("/")
    user, host, port = _split_host(netloc)
    if host not in LOOPBACK:
        return url
    return f"{scheme}://{user}{gateway}{port}{sep}{tail}"


def published_ports(urls: Iterable[str]) -> list[int]:
    """The TCP ports of the loopback URLs among `urls`: what the hosts may reach on the machine."""
    ports = set()
    for url in urls:
        if not url:
            continue
        parts = urlsplit(url if "://" in url else f"//{url}")
        if parts.hostname in ("127.0.0.1", "localhost", "::1") and parts.port:
            ports.add(parts.port)
    return sorted(ports)


def table_name(bridge: str) -> str:
    return "levers9_" + re.sub(r"[^A-Za-z0-9_]", "_", bridge)


def underlay_ruleset(bridge: str, gateway: str, ports: Iterable[int]) -> str:
    """The machine's rules for the underlay (idempotent, atomic): the published ports of the host
    side are forwarded to loopback; nothing else from a host reaches the machine, and nothing is
    routed between the underlay and other networks (host to host is bridged, and passes)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", bridge):
        raise HostsError(f"bridge name {bridge!r} cannot go into a rule")
    gw = ipaddress.IPv4Address(gateway)
    table, ports = table_name(bridge), sorted(set(ports))
    dnat = [f"    iifname \"{bridge}\" ip daddr {gw} tcp dport {{ {', '.join(map(str, ports))} }} dnat ip to 127.0.0.1"] \
        if ports else []
    lines = [
        f"table ip {table}", f"delete table ip {table}", f"table ip {table} {{",
        "  chain prerouting { type nat hook prerouting priority -100; policy accept;", *dnat, "  }",
        "  chain input { type filter hook input priority -10; policy accept;",
        f"    iifname \"{bridge}\" ct status dnat accept",
        f"    iifname \"{bridge}\" ct state established,related accept",
        f"    iifname \"{bridge}\" drop",
        "  }",
        "  chain forward { type filter hook forward priority -10; policy accept;",
        f"    iifname \"{bridge}\" oifname \"{bridge}\" accept",
        f"    iifname \"{bridge}\" drop",
        f"    oifname \"{bridge}\" drop",
        "  }", "}",
    ]
    return "\n".join(lines) + "\n"


def host_env(plan: HostPlan, urls: Mapping[str, str], hosts_subnet: str, home: Path) -> dict[str, str]:
    """LEVERS9_* of a worker running as host `plan`: the servers at the underlay's host side, its own
    address for everything it serves, its own container bridge and subnet, its own node cache."""
    env = {f"LEVERS9_{key.upper()}": rewrite_url(urls.get(key, ""), plan.gateway) for key in URL_KEYS
           if urls.get(key)}
    return {**env, "LEVERS9_HTTP_HOST": plan.address, "LEVERS9_HOST_ADDRESS": plan.address,
            "LEVERS9_HOSTS_SUBNET": hosts_subnet, "LEVERS9_BRIDGE_NAME": plan.bridge,
            "LEVERS9_BRIDGE_SUBNET": plan.container_subnet,
            "LEVERS9_CACHE_DIR": str(home / "hosts" / "cache" / plan.netns)}


# ---- ip(8), nft(8) -------------------------------------------------------------------------------

def _run(*cmd: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), input=stdin, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise HostsError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def _nft() -> str:
    nft = shutil.which("nft", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not nft:
        raise HostsError("nft is not installed (apt-get install nftables; scripts/setup.sh does)")
    return nft


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def existing_hosts() -> list[int]:
    """Numbers of the host namespaces on this machine now."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(n for n in (index_of(p.name) for p in NETNS_DIR.iterdir()) if n is not None)


def owner_key(owner: str | Path) -> str:
    return hashlib.sha256(str(owner).encode()).hexdigest()[:16]


def register_ports(bridge: str, owner: str | Path, ports: Iterable[int] | None) -> list[int]:
    """Record the ports `owner` (a home) publishes on `bridge` (None: forget them) and return what
    every owner publishes there: two homes with hosts on one machine share the underlay, and each
    one's rules must keep the other's ports (the table is rebuilt whole)."""
    folder = PORTS_DIR / re.sub(r"[^A-Za-z0-9_.-]", "_", bridge)
    folder.mkdir(parents=True, exist_ok=True)
    mine = folder / f"{owner_key(owner)}.ports"
    if ports is None:
        mine.unlink(missing_ok=True)
    else:
        mine.write_text(" ".join(str(p) for p in sorted(set(ports))))
    return sorted({int(p) for f in folder.glob("*.ports") for p in f.read_text().split()})


def ensure_underlay(bridge: str, hosts_subnet: str, urls: Iterable[str], owner: str | Path = "") -> str:
    """The underlay bridge with the host side's address, up, and its rules for `urls`' ports (and
    those other owners registered); returns the host side's address. Safe to call again."""
    net = ipaddress.IPv4Network(hosts_subnet, strict=True)
    gw = str(gateway_of(hosts_subnet))
    if not _link_exists(bridge):
        _run("ip", "link", "add", bridge, "type", "bridge")
    mac = bridge_mac(bridge)  # never the lowest of its ports' (levers9.runtime.bridge_mac says why)
    if mac not in _run("ip", "-o", "link", "show", "dev", bridge).stdout:
        _run("ip", "link", "set", "dev", bridge, "address", mac)
    have = _run("ip", "-o", "-4", "addr", "show", "dev", bridge).stdout
    if f" {gw}/{net.prefixlen} " not in have:
        _run("ip", "addr", "add", f"{gw}/{net.prefixlen}", "dev", bridge)
    _run("ip", "link", "set", bridge, "up")
    # DNAT to 127.0.0.1 of packets that arrive on this bridge only (not on any other interface)
    Path(f"/proc/sys/net/ipv4/conf/{bridge}/route_localnet").write_text("1")
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ports = register_ports(bridge, owner, published_ports(urls))
        _run(_nft(), "-f", "-", stdin=underlay_ruleset(bridge, gw, ports))
    return gw


def add_host(bridge: str, hosts_subnet: str, supernet: str, marker_dir: Path | None = None) -> HostPlan:
    """A new host: its namespace, its link into the underlay, its address and route, forwarding on.
    `marker_dir` gets a file per host (what `teardown` of that home removes)."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        plan = host_plan(free_index(existing_hosts(), hosts_subnet, supernet), hosts_subnet, supernet)
        if _link_exists(plan.outer_veth):  # left by a host whose namespace is gone
            _run("ip", "link", "del", plan.outer_veth, check=False)
        _run("ip", "netns", "add", plan.netns)
        try:
            _wire(plan, bridge)
        except BaseException:
            remove_host(plan)
            raise
    if marker_dir is not None:
        marker_dir.mkdir(parents=True, exist_ok=True)
        (marker_dir / plan.netns).write_text(f"{plan.address}\n")
    return plan


def _wire(plan: HostPlan, bridge: str) -> None:
    ns = ("ip", "-n", plan.netns)
    _run("ip", "link", "add", plan.outer_veth, "type", "veth", "peer", "name", plan.inner_veth)
    _run("ip", "link", "set", plan.inner_veth, "netns", plan.netns)
    _run("ip", "link", "set", plan.outer_veth, "master", bridge)
    _run("ip", "link", "set", plan.outer_veth, "up")
    _run(*ns, "link", "set", plan.inner_veth, "name", "eth0")
    _run(*ns, "addr", "add", f"{plan.address}/{plan.prefixlen}", "dev", "eth0")
    _run(*ns, "link", "set", "eth0", "up")
    _run(*ns, "link", "set", "lo", "up")
    _run(*ns, "route", "add", "default", "via", plan.gateway)
    # the host routes what arrives for its published containers into its bridge (its firewall decides)
    _run("nsenter", f"--net={NETNS_DIR / plan.netns}", "sysctl", "-qw", "net.ipv4.ip_forward=1")


def remove_host(plan: HostPlan) -> None:
    """Delete the host's namespace and its link (missing pieces are fine)."""
    if (NETNS_DIR / plan.netns).exists():
        _run("ip", "netns", "del", plan.netns, check=False)
    if _link_exists(plan.outer_veth):
        _run("ip", "link", "del", plan.outer_veth, check=False)


def teardown(bridge: str, hosts_subnet: str, supernet: str, marker_dir: Path) -> list[str]:
    """Remove the hosts named in `marker_dir`, and the underlay (bridge and rules) once no host of
    any home is left on it. Returns what was removed."""
    removed = []
    if marker_dir.is_dir():
        for marker in sorted(marker_dir.iterdir()):
            n = index_of(marker.name)
            if n is None or not marker.is_file():
                continue
            remove_host(host_plan(n, hosts_subnet, supernet))
            marker.unlink(missing_ok=True)
            removed.append(marker.name)
    others = register_ports(bridge, marker_dir, None)  # the ports this home published go
    if not existing_hosts() and _link_exists(bridge):
        _run("ip", "link", "del", bridge, check=False)
        _run(_nft(), "-f", "-", check=False,
             stdin=f"table ip {table_name(bridge)}\ndelete table ip {table_name(bridge)}\n")
        removed.append(bridge)
    elif _link_exists(bridge):  # other homes' hosts stay: their ports only
        _run(_nft(), "-f", "-", stdin=underlay_ruleset(bridge, str(gateway_of(hosts_subnet)), others))
    return removed
