"""Where a build step or a package install may connect, and how the egress proxy reads a request (pure).

Tenant code that needs the network (a build step, a `packages=` install: setup.py runs there) runs
in a container of its own network namespace on the worker's bridge; the firewall lets it reach one
address of the host, its worker's egress proxy (levers9.worker.network.egress_proxy), and nothing else. The
proxy connects only to the package indexes this host already uses, resolved by the proxy itself (the
containers have no DNS, and no packet of theirs is routed: no ip_forward, no NAT).

The allowlist is derived at run time, never written in the repository:
- the hosts of this host's pip configuration (index-url, extra-index-url, find-links, when http(s)),
  and pip's own default index (read from pip) when no index-url is configured;
- the hosts of this host's apt sources (levers9.worker.runtime.runc.rootfs parses them);
- `egress_allow` (host[:port], comma-separated) for more.

A request is refused (403, with why) unless it is `CONNECT host:port` or a plain-HTTP request with
an absolute URI, to an allowed host and port, and the host resolves to an address that is neither
the host's own, nor loopback, link-local, multicast, nor the platform's or the containers' networks.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import psutil

from levers9.worker.runtime.runc import rootfs

HEAD_LIMIT = 64 * 1024  # a request head longer than this is refused
HOP_HEADERS = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(Exception):
    """The proxy answers `status` with this message (a sentence: what was refused, and why)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass(frozen=True, order=True)
class Endpoint:
    host: str  # lower case, no brackets
    port: int


# ---- the allowlist ---------------------------------------------------------------------------------

def url_endpoint(url: str) -> Endpoint | None:
    """The host and port of an http(s) URL; None for anything else (file://, a path, junk)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return Endpoint(parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80))


def pip_endpoints(values: Iterable[tuple[str, str]], default_index: Iterable[str]) -> set[Endpoint]:
    """The index hosts of pip settings ((key, value) pairs, as levers9.worker.builds.buildah.pip_values gives
    them); pip's default index too unless an index-url replaces it."""
    values = list(values)
    found = {e for key, value in values if key in ("index-url", "extra-index-url", "find-links")
             for token in value.split() if (e := url_endpoint(token)) is not None}
    if not any(key == "index-url" and value.strip() for key, value in values):
        found |= {e for url in default_index if (e := url_endpoint(url)) is not None}
    return found


def pip_default_index() -> list[str]:
    """pip's own default index and the host its files come from, read from the pip installed here."""
    try:
        from pip._internal.models.index import PyPI
    except ImportError:  # no pip beside this worker: only what the configuration names
        return []
    return [PyPI.url, f"https://{PyPI.file_storage_domain}/"]


def apt_endpoints(files: Iterable[tuple[str, str]]) -> set[Endpoint]:
    """The hosts of every `deb` source in (file name, text) pairs of apt's sources."""
    found = set()
    for name, text in files:
        entries = rootfs._deb822_entries(text) if name.endswith(".sources") else rootfs._one_line_entries(text)
        for uris, _, _ in entries:
            found |= {e for uri in uris if (e := url_endpoint(uri)) is not None}
    return found


def parse_allow(text: str) -> set[Endpoint]:
    """`egress_allow`: "host[:port]" items, comma-separated; no port means 443 and 80."""
    found = set()
    for item in (part.strip().lower() for part in text.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":") if not item.endswith("]") else (item, "", "")
        if sep and port.isdigit() and 0 < int(port) < 65536:
            found.add(Endpoint(host.strip("[]"), int(port)))
        elif not sep or not host:
            found |= {Endpoint(item.strip("[]"), 443), Endpoint(item.strip("[]"), 80)}
        else:
            raise ValueError(f"egress_allow: {item!r} is not host or host:port")
    return found


# ---- a request -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    method: str
    target: Endpoint
    tunnel: bool  # CONNECT: bytes are piped as they are once the proxy answered 200
    head: bytes = b""  # plain HTTP: the head to send upstream (origin-form, hop headers dropped)


def parse_head(head: bytes) -> Request:
    """A proxy request's head (up to and with the blank line) -> Request; Refused(400/405) else."""
    if len(head) > HEAD_LIMIT:
        raise Refused(431, "the request head is too long")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise Refused(400, "not an HTTP/1 request line")
    method, target, version = (p.decode("latin-1") for p in parts)
    if method == "CONNECT":
        return Request(method, _authority(target), tunnel=True)
    if not target.startswith("http://"):
        raise Refused(405, "only CONNECT, or plain HTTP with an absolute http:// URI, goes through this proxy")
    endpoint = url_endpoint(target)
    if endpoint is None:
        raise Refused(400, "the request's URI names no host")
    split = urlsplit(target)
    path = (split.path or "/") + (f"?{split.query}" if split.query else "")
    kept = [line for line in lines[1:] if line and line.split(b":", 1)[0].strip().lower() not in HOP_HEADERS]
    rebuilt = b"\r\n".join([f"{method} {path} {version}".encode("latin-1"), *kept, b"Connection: close", b"", b""])
    return Request(method, endpoint, tunnel=False, head=rebuilt)


def _authority(target: str) -> Endpoint:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 < int(port) < 65536:
        raise Refused(400, f"CONNECT needs host:port, not {target[:100]!r}")
    return Endpoint(host.strip("[]").lower(), int(port))


def check_target(request: Request, allow: set[Endpoint]) -> None:
    """Refused(403) unless the request's host and port are on the allowlist."""
    if request.target not in allow:
        raise Refused(403, f"{request.target.host}:{request.target.port} is not a package index this "
                           f"worker's builds may reach (the worker's egress_allow setting adds hosts)")


def address_refusal(address: Address, denied: Iterable[Network]) -> str:
    """Why the proxy must not connect to `address` ("" when it may)."""
    if address.is_loopback or address.is_link_local or address.is_multicast or address.is_unspecified \
            or address.is_reserved:
        return f"{address} is a loopback, link-local, multicast or reserved address"
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        return address_refusal(mapped, denied)
    for net in denied:
        if address.version == net.version and address in net:
            return f"{address} is an address of this host, its containers or the platform"
    return ""


def denied_networks(addresses: Iterable[str], nets: Iterable[str]) -> list[Network]:
    """The host's own addresses (as /32, /128) and the platform's networks, as networks."""
    found: list[Network] = []
    for item in [*addresses, *nets]:
        try:
            found.append(ipaddress.ip_network(item.split("%", 1)[0], strict=False))
        except ValueError:
            continue
    return found


def host_addresses() -> list[str]:
    """This host's own addresses, every interface (read from the kernel)."""
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)]


def response(status: int, reason: str) -> bytes:
    """The proxy's own answer: a status line and the reason as a plain-text body."""
    body = (reason + "\n").encode()
    phrase = {200: "Connection established", 400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed",
              431: "Request Header Fields Too Large", 502: "Bad Gateway", 504: "Gateway Timeout"}.get(status, "Error")
    if status == 200:
        return b"HTTP/1.1 200 Connection established\r\n\r\n"
    return (f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


def proxy_env(proxy: str) -> dict[str, str]:
    """What a build step or an install needs to go through the proxy at "IP:PORT" (pip, apt, curl)."""
    url = f"http://{proxy}"
    return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
            "NO_PROXY": "", "no_proxy": ""}
