"""The worker's egress proxy, and the private network namespaces of build steps.

One proxy per worker (asyncio), listening on the bridge's host address. The firewall lets only
members with this proxy in their claim (a build step, a package install) reach it, and them nothing
else of the host (levers9.worker.network.firewall, EGRESS_MARK). It serves `CONNECT host:port` (pip's
HTTPS) and plain HTTP with an absolute URI (apt's http:// mirrors), each to an allowed package index
only, resolved here (levers9.worker.network.egress: what is allowed, and why a request is refused).

`Egress.lane(owner)` is a build step's network: a namespace of its own on the bridge with one veth
and an address claim naming this proxy, firewalled like every container's, removed afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from levers9.runtime.config import Settings
from levers9.worker.builds import buildah
from levers9.worker.runtime.choice import runc_missing

from . import bridge as network
from . import firewall
from .egress import (
    Endpoint,
    Network,
    Refused,
    address_refusal,
    apt_endpoints,
    check_target,
    denied_networks,
    host_addresses,
    parse_allow,
    parse_head,
    pip_default_index,
    pip_endpoints,
    proxy_env,
    response,
)

log = logging.getLogger("levers9.worker.network.egress_proxy")

HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 30.0
PIPE_CHUNK = 64 * 1024


def host_allowlist(settings: Settings, env: dict[str, str] | None = None, etc_apt: Path = Path("/etc/apt")) -> set[Endpoint]:
    """This host's package indexes (pip's configuration and default, apt's sources) and egress_allow."""
    env = dict(os.environ if env is None else env)
    texts = buildah.host_pip_texts(env)
    allow = pip_endpoints(buildah.pip_values(texts, env), pip_default_index())
    files = [etc_apt / "sources.list"] if (etc_apt / "sources.list").is_file() else []
    if (etc_apt / "sources.list.d").is_dir():
        files += sorted(p for p in (etc_apt / "sources.list.d").iterdir()
                        if p.suffix in (".list", ".sources") and p.is_file())
    allow |= apt_endpoints((p.name, p.read_text(errors="replace")) for p in files)
    return allow | parse_allow(settings.network.egress_allow)


class EgressProxy:
    """CONNECT and absolute-URI HTTP to `allow`, never to an address in `denied` (or loopback &c.)."""

    def __init__(self, allow: set[Endpoint], denied: list[Network],
                 resolve: Callable[[str, int], Awaitable[list[str]]] | None = None) -> None:
        self.allow, self.denied = allow, denied
        self.resolve = resolve or _resolve
        self.refused = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
                request = parse_head(head)
                check_target(request, self.allow)
                up_reader, upstream = await self.connect(request.target)
            except Refused as exc:
                self.refused += 1
                log.info("egress refused: %s", exc.reason)
                writer.write(response(exc.status, exc.reason))
                await writer.drain()
                return
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError):
                writer.write(response(400, "no complete request head"))
                return
            if request.tunnel:
                writer.write(response(200, ""))
            else:
                upstream.write(request.head)
            await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
        except (ConnectionError, OSError):
            pass
        finally:
            for w in (upstream, writer):
                if w is not None:
                    w.close()

    async def connect(self, target: Endpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the first allowed address of the target; Refused when there is none."""
        try:
            addresses = await asyncio.wait_for(self.resolve(target.host, target.port), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            raise Refused(502, f"{target.host} does not resolve from this worker") from None
        refusal, failure = "", f"{target.host} has no address"
        for text in addresses:
            why = address_refusal(ipaddress.ip_address(text), self.denied)
            if why:
                refusal = f"{target.host} resolves to {why}"
                continue
            try:
                return await asyncio.wait_for(asyncio.open_connection(text, target.port, limit=PIPE_CHUNK),
                                              CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError) as exc:
                failure = f"{target.host}:{target.port} did not answer ({type(exc).__name__})"
        raise Refused(403, refusal) if refusal and failure.endswith("no address") else Refused(502, failure)


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            chunk = await reader.read(PIPE_CHUNK)
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


class Egress:
    """The worker's proxy (served on the bridge's host address) and its build steps' namespaces."""

    def __init__(self, settings: Settings, state_dir: Path) -> None:
        self.settings, self.state_dir = settings, state_dir
        self.ipam = network.Ipam(settings.network.bridge_name, settings.network.bridge_subnet)
        self.address = ""  # "IP:PORT" while serving
        self.served = asyncio.Event()
        self.proxy: EgressProxy | None = None

    async def serve(self, stop: asyncio.Event) -> None:
        """Serve until `stop`; nothing where this worker has no bridge (no root: no containers)."""
        if runc_missing():
            log.info("egress proxy: not served (%s)", runc_missing())
            return
        s = self.settings
        bridge = await network.ensure_bridge(s.network.bridge_name, s.network.bridge_subnet)
        allow = await asyncio.to_thread(host_allowlist, s)
        denied = denied_networks(host_addresses(), [s.network.bridge_subnet, s.network.hosts_subnet, "127.0.0.0/8",
                                                    *(str(a) for a in firewall.platform_addresses(
                                                        (s.bus.nats_url, s.database.url, s.storage.s3_endpoint, s.registry.address,
                                                         s.client.gateway_url)))])
        self.proxy = EgressProxy(allow, denied)
        server = await asyncio.start_server(self.proxy.handle, str(bridge.ip), s.network.egress_proxy_port,
                                            limit=PIPE_CHUNK)
        self.address = f"{bridge.ip}:{server.sockets[0].getsockname()[1]}"
        log.info("egress proxy on %s for %s", self.address, ", ".join(f"{e.host}:{e.port}" for e in sorted(allow)))
        self.served.set()
        try:
            await stop.wait()
        finally:
            server.close()
            self.address = ""
            self.served.clear()

    async def ready(self, timeout: float = 60.0) -> str:
        """The proxy's "IP:PORT" once it serves; RuntimeError (saying why) when it does not."""
        try:
            await asyncio.wait_for(self.served.wait(), timeout)
        except asyncio.TimeoutError:
            raise RuntimeError("this worker's egress proxy is not serving (it needs root and the bridge): "
                               "builds and package installs cannot reach a package index") from None
        return self.address

    def env(self) -> dict[str, str]:
        return proxy_env(self.address)

    @contextlib.asynccontextmanager
    async def lane(self, owner: str) -> AsyncIterator[Path]:
        """A network namespace of its own for `owner` (a build step): one veth on the bridge, the
        firewall's rules for it (its proxy only), gone afterwards. Yields the namespace's path."""
        proxy = await self.ready()
        names = network.Names.of(self.state_dir, owner)
        ip = self.ipam.claim(owner, self.state_dir, names.netns, proxy=proxy)
        try:
            await network.attach(names, self.settings.network.bridge_name, self.settings.network.bridge_subnet, ip)
            await self.guard()
            await network.ip("neigh", "flush", "to", ip, "dev", self.settings.network.bridge_name, check=False)
            yield network.netns_path(names)
        finally:
            await network.detach(names)
            self.ipam.release(ip, owner)
            await self.guard()

    async def guard(self) -> None:
        s = self.settings
        await firewall.guard(s, self.ipam.members, lambda: self.ipam.forwards(s.network.publish_port_base))
