"""The registry launcher: Debian's docker-registry (the CNCF distribution registry), its data under
home/registry/.

Built images and their per-step cache tags are pushed here; skopeo, buildah or podman pull them with
`--tls-verify=false` (it listens on 127.0.0.1 only, plain HTTP). Its URL is `host:port`, the form an
image reference starts with (`127.0.0.1:5123/levers9/images:im-...`), and services get it as
LEVERS9_REGISTRY.

The port is kept across `down`/`up` when it is still free: references to images in it (a
blueprint's `base_image`, a stored ImagePushed) then stay valid; other servers' URLs are not kept in
anything durable, so they take a fresh port each start.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from . import procs
from .home import Home, Launch, Server
from .procs import LOCALHOST, Progress, http_status

if TYPE_CHECKING:
    from levers9.runtime.config import Settings

BINARY = "/usr/bin/docker-registry"  # Debian's package `docker-registry`


def launch(home: Home, settings: Settings, progress: Progress) -> Launch:
    root = home.path / "registry"
    (root / "data").mkdir(parents=True, exist_ok=True)
    port = _port(root)
    config = write_config(root, port)
    progress(f"registry: starting on {LOCALHOST}:{port}")
    proc, offset = home.spawn("registry", [binary(), "serve", str(config)])
    url = f"{LOCALHOST}:{port}"
    entry = {"pid": proc.pid, "port": port, "external": False, "url": url}
    return Launch("registry", proc, offset, entry, lambda: probe(url, entry))


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
        "http:",
        f"  addr: {LOCALHOST}:{port}",
        f"  secret: {secret}",
        "  headers:",
        "    X-Content-Type-Options: [nosniff]",
        "",
    ])


def write_config(root: Path, port: int) -> Path:
    path = root / "config.yml"
    path.touch(mode=0o600)  # holds the upload secret
    path.write_text(config_text(root / "data", port, secrets.token_hex(16)))
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
    """The registry API answers `GET /v2/` with 200 (no auth configured)."""
    return http_status(f"http://{url.removeprefix('http://').rstrip('/')}/v2/") == 200


SERVER = Server("registry", launch=launch, marker=marker, probe=probe, max_stop_timeout=5.0)
