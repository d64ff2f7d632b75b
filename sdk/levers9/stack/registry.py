"""The registry launcher: Debian's docker-registry (the CNCF distribution registry), its data under
home/registry/.

Built images and their per-step cache tags are pushed here; skopeo, buildah or podman pull them with
`--tls-verify=false` (it listens on 127.0.0.1 only, plain HTTP). Its URL is `host:port`, the form an
image reference starts with (`127.0.0.1:5123/levers9/images:im-...`), and services get it as
LEVERS9_REGISTRY.

Every request needs a password (htpasswd, bcrypt; home/registry/htpasswd, 0600). Plain htpasswd
cannot tell a push from a pull, so the passwords go only to the processes that use the registry: the
build pool's workers (user `build`: they push layers and pull cache tags and bases) and the
image-builder (user `image-builder`: it copies built images out and deletes them); `admin` is the
CLI's and the tests'. buildah and skopeo read them from a containers auth file (REGISTRY_AUTH_FILE,
credentials/registry-<user>.json), written for both the loopback address and the worker hosts'
underlay address of the registry.

The port is kept across `down`/`up` when it is still free: references to images in it (a
blueprint's `base_image`, a stored ImagePushed) then stay valid; other servers' URLs are not kept in
anything durable, so they take a fresh port each start.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import bcrypt

from . import credentials, procs
from .home import Home, Launch, Server
from .procs import LOCALHOST, Progress, http_status

if TYPE_CHECKING:
    from levers9.runtime.config import Settings

BINARY = "/usr/bin/docker-registry"  # Debian's package `docker-registry`


def launch(home: Home, settings: Settings, progress: Progress) -> Launch:
    root = home.path / "registry"
    (root / "data").mkdir(parents=True, exist_ok=True)
    port = _port(root)
    passwords = credentials.ensure(home.path)["registry"]
    write_htpasswd(root / "htpasswd", passwords)
    config = write_config(root, port)
    write_auth_files(home.path, [f"{LOCALHOST}:{port}", *_underlay(settings.network.hosts_subnet, port)], passwords)
    progress(f"registry: starting on {LOCALHOST}:{port}")
    # REGISTRY_* variables override its config (REGISTRY_AUTH_FILE, meant for buildah, would be `auth.file`)
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    proc, offset = home.spawn("registry", [binary(), "serve", str(config)], env=env)
    url = f"{LOCALHOST}:{port}"
    entry = {"pid": proc.pid, "port": port, "external": False, "url": url, "auth": True}
    return Launch("registry", proc, offset, entry, lambda: probe(url, entry))


def htpasswd_text(passwords: dict[str, str], rounds: int = 10) -> str:
    """An htpasswd file of bcrypt hashes (the only kind docker-registry reads)."""
    return "".join(f"{user}:{bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds)).decode()}\n"
                   for user, pw in sorted(passwords.items()))


def write_htpasswd(path: Path, passwords: dict[str, str]) -> None:
    """(Re)written when a user or password changed: bcrypt takes a moment, and the hashes are salted."""
    current = {}
    with contextlib.suppress(OSError):
        current = dict(line.split(":", 1) for line in path.read_text().splitlines() if ":" in line)
    if set(current) == set(passwords) and all(bcrypt.checkpw(pw.encode(), current[u].encode())
                                              for u, pw in passwords.items()):
        return
    credentials.write_private(path, htpasswd_text(passwords))


def auth_file(home: Path, user: str) -> Path:
    return credentials.credentials_dir(home) / f"registry-{user}.json"


def write_auth_files(home: Path, hosts: list[str], passwords: dict[str, str]) -> None:
    for user, password in passwords.items():
        credentials.write_private(auth_file(home, user), credentials.registry_auth(hosts, user, password))


def _underlay(hosts_subnet: str, port: int) -> list[str]:
    """The registry's address as worker hosts see it (the underlay's host side, levers9.runtime.hosts)."""
    with contextlib.suppress(ValueError):
        return [f"{ipaddress.ip_network(hosts_subnet, strict=False).network_address + 1}:{port}"]
    return []


def binary() -> str:
    if Path(BINARY).exists():
        return BINARY
    return procs.binary("docker-registry")  # raises with what to install


def config_text(data: Path, port: int, secret: str) -> str:
    """The registry's YAML config: filesystem storage, deletes allowed (`levers9 images delete`),
    plain HTTP on loopback, warnings only (info logs a line per request: a push is hundreds)."""
    return "\n".join([
        "version: 0.1",
        "log:",
        "  level: warn",
        "  accesslog:",
        "    disabled: true",
        "storage:",
        "  filesystem:",
        f"    rootdirectory: {data}",
        "  delete:",
        "    enabled: true",
        "  cache:",
        "    blobdescriptor: inmemory",
        "auth:",
        "  htpasswd:",
        "    realm: levers9",
        f"    path: {data.parent / 'htpasswd'}",
        "http:",
        f"  addr: {LOCALHOST}:{port}",
        f"  secret: {secret}",
        "  headers:",
        "    X-Content-Type-Options: [nosniff]",
        "",
    ])


def write_config(root: Path, port: int) -> Path:
    path = root / "config.yml"
    credentials.write_private(path, config_text(root / "data", port, secrets.token_hex(16)))  # the upload secret
    (root / "port").write_text(f"{port}\n")
    return path


def _port(root: Path) -> int:
    """The port of the last start when it is free now, else a fresh one."""
    with contextlib.suppress(OSError, ValueError):
        last = int((root / "port").read_text().split()[0])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # as Go's listener does: connections of the last run in TIME_WAIT do not make it taken
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((LOCALHOST, last))
        if procs.claim_port(last):
            return last
    return procs.free_port()  # looked up on the module: a test hands out a taken port


def marker(home: Path) -> str:
    return str(home / "registry" / "config.yml")


def probe(url: str, entry: dict | None) -> bool:
    """The registry API answers `GET /v2/`: 200, or 401 when it asks for a password (ours does)."""
    return http_status(f"http://{url.removeprefix('http://').rstrip('/')}/v2/") in (200, 401)


SERVER = Server("registry", launch=launch, marker=marker, probe=probe, max_stop_timeout=5.0,
                current=lambda entry: bool(entry.get("auth")))
