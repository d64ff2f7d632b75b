"""The worker's firewall on its bridge: containers reach nothing of the host and no other container.

One nftables script per bridge, rendered from the bridge's address claims (levers9.worker.network.bridge)
by a pure function and applied atomically with `nft -f` (the script deletes and recreates its two
tables in one transaction, so applying it again is a no-op and a half-applied state never exists):

- `table inet levers9_<bridge>`, hook input: traffic that enters the host from the bridge is
  dropped unless it answers a connection the host opened (ct established/related). This covers
  every host address (the bridge's own, eth0's, IPv6 link-local ones): whatever they arrive on,
  packets from a container are delivered locally through the bridge. The gateway and the worker
  open their connections to containers, so their answers pass.
- same table, hook forward: a container's traffic routed beyond the bridge is dropped unless its
  destination is in `container_egress` (default: none, as before: no ip_forward, no NAT) and not a
  platform address; nothing from outside is routed into the bridge unless it answers.
- `table bridge levers9_<bridge>`, hook forward: frames between two container ports of the bridge
  are dropped unless both containers are in the same peer group (`container_peers`: "none", the
  default, no group at all; "deployment": same workspace and deployment; "workspace": same
  workspace). ARP passes. Ports are named by the host veth (`l9h…`, one per container), never by
  IP, so a stale entry or a spoofed address opens nothing.
- same table, hook input: the one exception to "nothing of the host". A member with an egress
  proxy (a build step or a package install: `Member.proxy`, "IP:PORT" of its worker's proxy,
  levers9.worker.network.egress_proxy) gets its TCP packets to exactly that address and port marked
  (EGRESS_MARK) as they leave its veth; the inet input chain accepts marked packets before its drop.
  The mark is set by port name, never by IP, and a container cannot set it itself (no CAP_NET_ADMIN).

The rules live as long as the bridge (they are what makes a container on it safe); a container's
entries go with its claim when it is torn down; `remove` drops both tables.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import ipaddress
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from levers9.runtime.config import Settings

PEER_POLICIES = ("none", "deployment", "workspace")
EGRESS_MARK = 0x4C39E6  # packets of a member to its egress proxy (set in the bridge table, read in inet)


class FirewallError(RuntimeError):
    pass


# ---- pure ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Member:
    """One container on the bridge: its host-side veth, its peer group ("" = none) and the egress
    proxy it may reach ("IP:PORT" on the host; "" = none: a workload)."""
    host_veth: str
    group: str = ""
    proxy: str = ""


@dataclass(frozen=True)
class Forward:
    """A container published on the host's address (a worker running as a host: levers9.worker.network.hosts)."""
    host_port: int
    ip: str
    port: int


def _nat_rules(br: str, host_address: str, forwards: list[Forward]) -> list[str]:
    """DNAT of host_address:host_port to each container: from outside the bridge (never from a
    container: that would reach another container around the peer rules) and from the host itself."""
    if not host_address or not forwards:
        return []
    addr = ipaddress.IPv4Address(host_address)
    rules = [(f.host_port, ipaddress.IPv4Address(f.ip), int(f.port)) for f in sorted(forwards, key=lambda f: f.host_port)]
    pre = [f"    iifname != {br} ip daddr {addr} tcp dport {hp} dnat ip to {ip}:{p}" for hp, ip, p in rules]
    out = [f"    ip daddr {addr} tcp dport {hp} dnat ip to {ip}:{p}" for hp, ip, p in rules]
    return ["  chain prerouting { type nat hook prerouting priority -100; policy accept;", *pre, "  }",
            "  chain output { type nat hook output priority -100; policy accept;", *out, "  }"]


def peer_group(policy: str, workspace: str, deployment_id: str) -> str:
    """The peer group of a container under `policy` ("" = it reaches no other container)."""
    if policy not in PEER_POLICIES:
        raise FirewallError(f"container_peers must be one of {', '.join(PEER_POLICIES)}, not {policy!r}")
    if policy == "workspace" and workspace:
        return f"w:{workspace}"
    if policy == "deployment" and workspace and deployment_id:
        return f"d:{workspace}/{deployment_id}"
    return ""


def host_veth_of(netns: str) -> str:
    """The host end of a container's veth pair from its namespace name (network.Names: l9-X, l9hX)."""
    return "l9h" + netns[3:] if netns.startswith("l9-") else ""


def parse_egress(text: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """`container_egress`: comma-separated networks containers may open connections to beyond the
    bridge (empty: none). Raises FirewallError saying which entry is wrong."""
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise FirewallError(f"container_egress: {item!r} is not a network (e.g. 203.0.113.0/24, "
                                f"0.0.0.0/0)") from None
    return nets


def platform_addresses(urls: Iterable[str]) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The IP literals of the control plane's URLs (NATS, Postgres, S3, registry): never egress,
    whatever `container_egress` allows (host names are not resolved here)."""
    found = []
    for url in urls:
        if not url:
            continue
        host = urlsplit(url if "://" in url else f"//{url}").hostname or ""
        try:
            found.append(ipaddress.ip_address(host))
        except ValueError:
            continue
    return sorted(set(found), key=lambda a: (a.version, int(a)))


def table_name(bridge: str) -> str:
    return "levers9_" + re.sub(r"[^A-Za-z0-9_]", "_", bridge)


def _set_name(group: str) -> str:
    return "g_" + hashlib.sha1(group.encode()).hexdigest()[:12]


def _elements(names: Iterable[str]) -> str:
    names = sorted(set(names))
    return f" elements = {{ {', '.join(_quoted(n) for n in names)} }};" if names else ""


def _quoted(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,15}", name):
        raise FirewallError(f"interface name {name!r} cannot go into a rule")
    return f'"{name}"'


def proxy_endpoint(proxy: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """"10.209.0.1:3128" -> (address, port); FirewallError when it is anything else."""
    host, _, port = proxy.rpartition(":")
    try:
        addr, number = ipaddress.ip_address(host.strip("[]")), int(port)
    except ValueError:
        raise FirewallError(f"egress proxy {proxy!r} is not IP:PORT") from None
    if not 0 < number < 65536:
        raise FirewallError(f"egress proxy {proxy!r}: port out of range")
    return addr, number


def _proxy_rules(members: list[Member]) -> list[str]:
    """Bridge input: mark each proxied member's packets to its own proxy (and nothing else)."""
    rules = []
    for m in sorted((m for m in members if m.proxy), key=lambda m: m.host_veth):
        addr, port = proxy_endpoint(m.proxy)
        family = "ip" if addr.version == 4 else "ip6"
        rules.append(f"    iifname {_quoted(m.host_veth)} {family} daddr {addr} tcp dport {port} "
                     f"meta mark set {EGRESS_MARK:#x}")
    return rules


def _egress_rules(br: str, egress: list, deny: list) -> list[str]:
    rules = []
    for addr in deny:
        rules.append(f"iifname {br} {'ip' if addr.version == 4 else 'ip6'} daddr {addr} drop")
    for net in egress:
        rules.append(f"iifname {br} {'ip' if net.version == 4 else 'ip6'} daddr {net} accept")
    return rules


def ruleset(bridge: str, members: Iterable[Member], egress: Iterable = (), deny: Iterable = (),
            forwards: Iterable[Forward] = (), host_address: str = "") -> str:
    """The nft script that makes the bridge's rules exactly these (idempotent, atomic). With
    `host_address` (a worker running as a host) the `forwards` publish containers there: connections
    to them, and their answers, are the only traffic routed between the bridge and the outside."""
    br, table = _quoted(bridge), table_name(bridge)
    members = list(members)
    nat = _nat_rules(br, host_address, list(forwards))
    groups: dict[str, list[str]] = {}
    for m in members:
        if m.group:
            groups.setdefault(m.group, []).append(m.host_veth)
    peer_sets = [f"  set {_set_name(g)} {{ type ifname;{_elements(v)} }}" for g, v in sorted(groups.items())]
    peer_rules = [f"    iifname @{_set_name(g)} oifname @{_set_name(g)} accept" for g in sorted(groups)]
    forward = [*(["ct status dnat accept"] if nat else []),  # a published container's connections
               f"iifname {br} oifname {br} accept",  # bridged (br_netfilter): the bridge table decides
               *_egress_rules(br, list(egress), list(deny)),
               f"iifname {br} drop",
               f"oifname {br} ct state established,related accept",
               f"oifname {br} drop"]
    lines = [
        f"table inet {table}", f"delete table inet {table}", f"table inet {table} {{",
        "  chain input { type filter hook input priority -10; policy accept;",
        *([f"    iifname {br} meta mark {EGRESS_MARK:#x} accept"]  # to its proxy (bridge table, input)
          if any(m.proxy for m in members) else []),
        f"    iifname {br} ct state established,related accept",
        f"    iifname {br} drop",
        "  }",
        "  chain forward { type filter hook forward priority -10; policy accept;",
        *(f"    {rule}" for rule in forward),
        "  }", *nat, "}",
        f"table bridge {table}", f"delete table bridge {table}", f"table bridge {table} {{",
        f"  set ports {{ type ifname;{_elements(m.host_veth for m in members)} }}",
        *peer_sets,
        "  chain input { type filter hook input priority -10; policy accept;",
        *_proxy_rules(members),
        "  }",
        "  chain forward { type filter hook forward priority -10; policy accept;",
        "    ether type arp accept",
        *peer_rules,
        "    iifname @ports drop",
        "    oifname @ports drop",
        "  }", "}",
    ]
    return "\n".join(lines) + "\n"


def removal(bridge: str) -> str:
    """The nft script that removes the bridge's tables (present or not)."""
    table = table_name(bridge)
    return "".join(f"table {family} {table}\ndelete table {family} {table}\n" for family in ("inet", "bridge"))


# ---- nft(8) --------------------------------------------------------------------------------------

def nft_missing() -> str | None:
    """Why the firewall cannot be installed here, or None."""
    if not shutil.which("nft", path="/usr/sbin:/sbin:/usr/bin:/bin"):
        return "nft is not installed (apt-get install nftables; scripts/setup.sh does)"
    return None


async def apply(script: str) -> None:
    missing = nft_missing()
    if missing:
        raise FirewallError(f"cannot isolate containers: {missing}")
    nft = shutil.which("nft", path="/usr/sbin:/sbin:/usr/bin:/bin") or "nft"
    proc = await asyncio.create_subprocess_exec(nft, "-f", "-", stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate(script.encode())
    if proc.returncode != 0:
        raise FirewallError(f"nft refused the container firewall: {err.decode().strip() or proc.returncode}")


async def sync(bridge: str, members_of: Callable[[], list[Member]], egress: str = "", platform_urls: Iterable[str] = (),
               lock_dir: Path = Path("/run/levers9/ipam"), *, deny_nets: str = "",
               forwards_of: Callable[[], list[Forward]] = list, host_address: str = "") -> None:
    """Render the bridge's rules from its current members and apply them; one writer at a time
    across the machine's workers (a stale snapshot would only leave out a container: closed).
    `deny_nets` (CIDRs): never egress either (a host's underlay: the other hosts, the machine)."""
    nets = parse_egress(egress)
    deny = [*platform_addresses(platform_urls), *parse_egress(deny_nets)]
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f".{bridge}.firewall.lock", "w") as lock:
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
        await apply(ruleset(bridge, members_of(), nets, deny, forwards_of(), host_address))


async def guard(settings: Settings, members_of: Callable[[], list[Member]],
                forwards_of: Callable[[], list[Forward]]) -> None:
    """The worker's rules for its bridge (what every worker of the machine renders alike): the
    platform's addresses never egress; a host's underlay never either, its containers published."""
    s = settings
    await sync(s.network.bridge_name, members_of, s.network.container_egress,
               (s.bus.nats_url, s.database.url, s.storage.s3_endpoint, s.registry.address, s.client.gateway_url),
               deny_nets=s.network.hosts_subnet if s.network.host_address else "", host_address=s.network.host_address,
               forwards_of=forwards_of if s.network.host_address else list)


async def remove(bridge: str) -> None:
    await apply(removal(bridge))

