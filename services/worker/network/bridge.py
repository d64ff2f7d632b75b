"""Container networking: one bridge per machine, one network namespace and veth pair per container.

The bridge (`bridge_name`) carries the subnet's first host address on the host side; each container
gets its own namespace `l9-<short>` with `eth0` (an address of the subnet) and `lo`, and a default
route via the bridge address. The gateway runs on this host and talks to the containers' addresses
directly over the bridge, so there is no IP forwarding and no NAT: containers get no outbound
internet and reach nothing beyond this subnet (the machines' network rule). Keep the subnet
configurable and clear of real networks. The firewall (levers9.worker.network.firewall) keeps containers off
the host and off each other; its rules are rendered from the claims below (`members`).

Addresses are allocated across all worker processes of the machine by claim files created with
O_EXCL in `/run/levers9/ipam/<bridge>/<ip>` (tmpfs: they vanish on reboot, like the namespaces).
A claim holds its owner's container id, worker pid and state dir, and the container's peer group
(firewall.peer_group: "" when it may reach no other container).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import ipaddress
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from levers9.runtime.bridge_mac import bridge_mac

from . import firewall, hosts

IPAM_ROOT = Path("/run/levers9/ipam")
NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    pass


class AddressesExhausted(NetworkError):
    pass


# ---- pure ----------------------------------------------------------------------------------------

def bridge_address(subnet: str) -> ipaddress.IPv4Interface:
    """The host side of the bridge: the subnet's first host address, e.g. 10.209.0.1/24."""
    net = ipaddress.ip_network(subnet, strict=True)
    if not isinstance(net, ipaddress.IPv4Network) or net.num_addresses < 4:
        raise NetworkError(f"bridge subnet {subnet!r} must be an IPv4 network of /30 or larger")
    return ipaddress.IPv4Interface(f"{net.network_address + 1}/{net.prefixlen}")


def next_free_address(subnet: str, claimed: Iterable[str]) -> ipaddress.IPv4Address:
    """The lowest host address of `subnet` that is neither the bridge's nor claimed.

    Raises AddressesExhausted when every address is taken.
    """
    net = ipaddress.IPv4Network(subnet, strict=True)
    taken = {ipaddress.ip_address(a) for a in claimed} | {bridge_address(subnet).ip}
    for host in net.hosts():
        if host not in taken:
            return host
    raise AddressesExhausted(f"no free address left in {subnet}: all {net.num_addresses - 3} "
                             f"container addresses are claimed (stop containers or use a larger "
                             f"bridge_subnet)")


@dataclass(frozen=True)
class Names:
    """Interface and namespace names of one container (kernel limit: 15 characters)."""
    netns: str
    host_veth: str
    peer_veth: str

    @classmethod
    def of(cls, state_dir: Path, container_id: str) -> "Names":
        # the worker's state dir is part of the hash: two workers may run the same container id
        short = hashlib.sha1(f"{Path(state_dir).resolve()}\0{container_id}".encode()).hexdigest()[:10]
        return cls(netns=f"l9-{short}", host_veth=f"l9h{short}", peer_veth=f"l9c{short}")


# ---- address claims ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    ip: str
    container_id: str
    pid: int
    state_dir: str
    netns: str
    group: str = ""
    port: int = 0  # the container's port (published on the host's address when the worker is a host)
    proxy: str = ""  # "IP:PORT" of the egress proxy it may reach (a build step or an install), "" none


class Ipam:
    """Claim files for one bridge; safe across processes (O_EXCL create is the allocation)."""

    def __init__(self, bridge: str, subnet: str, root: Path = IPAM_ROOT):
        self.subnet = subnet
        self.dir = Path(root) / bridge

    def claims(self) -> list[Claim]:
        found: list[Claim] = []
        if not self.dir.is_dir():
            return found
        for path in self.dir.iterdir():
            if path.name.startswith("."):
                continue
            try:
                data = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                data = {}  # being written right now, or torn: still taken
            found.append(Claim(ip=path.name, container_id=data.get("container_id", ""),
                               pid=int(data.get("pid", 0)), state_dir=data.get("state_dir", ""),
                               netns=data.get("netns", ""), group=data.get("group", ""),
                               port=int(data.get("port", 0)), proxy=str(data.get("proxy", ""))))
        return found

    def claim(self, container_id: str, state_dir: Path, netns: str, group: str = "", port: int = 0,
              proxy: str = "") -> str:
        self.dir.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"container_id": container_id, "pid": os.getpid(), "state_dir": str(state_dir),
                           "netns": netns, "group": group, "port": port,
                           **({"proxy": proxy} if proxy else {})}).encode()
        tried: set[str] = set()
        reclaimed = False
        while True:
            try:
                ip = str(next_free_address(self.subnet, {c.ip for c in self.claims()} | tried))
            except AddressesExhausted:
                if reclaimed:
                    raise
                self.reclaim_stale()
                reclaimed = True
                tried = set()
                continue
            try:
                fd = os.open(self.dir / ip, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                tried.add(ip)  # another worker was quicker
                continue
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            return ip

    def members(self) -> list[firewall.Member]:
        """The firewall's view of the bridge: every claimed container's host veth and peer group."""
        return [firewall.Member(firewall.host_veth_of(c.netns), c.group, c.proxy) for c in self.claims()
                if firewall.host_veth_of(c.netns)]

    def forwards(self, base: int) -> list[firewall.Forward]:
        """The published ports of the claimed containers (a worker running as a host: levers9.worker.network.hosts)."""
        return [firewall.Forward(hosts.published_port(self.subnet, c.ip, base), c.ip, c.port)
                for c in self.claims() if c.port and _in(c.ip, self.subnet)]

    def release(self, ip: str, container_id: str) -> None:
        """Remove the claim of `ip` if `container_id` still holds it."""
        for claim in self.claims():
            if claim.ip == ip and claim.container_id == container_id:
                (self.dir / ip).unlink(missing_ok=True)

    def release_owned(self, container_id: str, state_dir: Path) -> list[str]:
        released = []
        for claim in self.claims():
            if claim.container_id == container_id and claim.state_dir == str(state_dir):
                (self.dir / claim.ip).unlink(missing_ok=True)
                released.append(claim.ip)
        return released

    def reclaim_stale(self) -> list[str]:
        """Drop claims whose worker is gone AND whose namespace is gone (nothing uses the address)."""
        dropped = []
        for claim in self.claims():
            if claim.pid and not _alive(claim.pid) and claim.netns and \
                    not (NETNS_DIR / claim.netns).exists():
                (self.dir / claim.ip).unlink(missing_ok=True)
                dropped.append(claim.ip)
        return dropped


def _in(ip: str, subnet: str) -> bool:
    try:
        return ipaddress.ip_address(ip) in ipaddress.ip_network(subnet)
    except ValueError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- ip(8) ---------------------------------------------------------------------------------------

async def ip(*args: str, check: bool = True, netns: str | None = None) -> str:
    cmd = ["ip", *(("-n", netns) if netns else ()), *args]
    proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if check and proc.returncode != 0:
        raise NetworkError(f"{' '.join(cmd)}: {err.decode().strip() or proc.returncode}")
    return out.decode()


async def ip_batch(lines: list[str], netns: str | None = None) -> None:
    """Several ip(8) commands in one process (each exec of ip costs a few ms)."""
    cmd = ["ip", *(("-n", netns) if netns else ()), "-batch", "-"]
    proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate("\n".join(lines).encode() + b"\n")
    if proc.returncode != 0:
        raise NetworkError(f"ip -batch {lines}: {err.decode().strip() or proc.returncode}")


async def link_exists(name: str) -> bool:
    """Asked of ip(8), not /sys/class/net: a worker of the netns backend has only its network entered
    (`nsenter --net`), and the machine's sysfs it sees lists the machine's links, not its own."""
    proc = await asyncio.create_subprocess_exec("ip", "link", "show", "dev", name, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    return await proc.wait() == 0


async def ensure_bridge(name: str, subnet: str) -> ipaddress.IPv4Interface:
    """Create the bridge with its address and bring it up; safe to call from several workers."""
    addr = bridge_address(subnet)
    if len(name) > 15:
        raise NetworkError(f"bridge name {name!r} is longer than 15 characters")
    IPAM_ROOT.mkdir(parents=True, exist_ok=True)
    with open(IPAM_ROOT / f".{name}.lock", "w") as lock:
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
        if not await link_exists(name):
            await ip("link", "add", name, "type", "bridge")
        current = json.loads(await ip("-j", "addr", "show", "dev", name) or "[]")
        mac = bridge_mac(name)  # never the lowest of its ports' (levers9.runtime.bridge_mac says why)
        if any(entry.get("address") != mac for entry in current):
            await ip("link", "set", "dev", name, "address", mac)
        have = {f"{a['local']}/{a['prefixlen']}" for entry in current
                for a in entry.get("addr_info", []) if a.get("family") == "inet"}
        if str(addr) not in have:
            await ip("addr", "add", str(addr), "dev", name)
        await ip("link", "set", name, "up")
    return addr


async def attach(names: Names, bridge: str, subnet: str, address: str) -> None:
    """Make the namespace, a veth pair into it as eth0 with `address`, lo up, default route."""
    gw = bridge_address(subnet)
    prefix = gw.network.prefixlen
    await ip("netns", "add", names.netns)
    try:
        await ip_batch([
            f"link add {names.host_veth} type veth peer name {names.peer_veth}",
            f"link set {names.peer_veth} netns {names.netns}",
            f"link set {names.host_veth} master {bridge}",
            f"link set {names.host_veth} up",
        ])
        await ip_batch([
            f"link set {names.peer_veth} name eth0",
            f"addr add {address}/{prefix} dev eth0",
            "link set eth0 up",
            "link set lo up",
            f"route add default via {gw.ip}",
        ], netns=names.netns)
    except BaseException:
        await detach(names)
        raise


async def detach(names: Names) -> None:
    """Delete the namespace and the veth pair; missing pieces are fine (idempotent)."""
    if (NETNS_DIR / names.netns).exists():
        await ip("netns", "del", names.netns, check=False)
    # the pair dies with the namespace, but only once nothing holds it: delete the host end too
    if await link_exists(names.host_veth):
        await ip("link", "del", names.host_veth, check=False)


def netns_path(names: Names) -> Path:
    return NETNS_DIR / names.netns
