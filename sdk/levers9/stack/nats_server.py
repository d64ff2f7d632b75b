"""The NATS launcher: nats-server with JetStream, its data under home/nats/, a monitor port for health."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from . import procs
from .home import Home, Launch, Server
from .procs import LOCALHOST, Progress, binary, http_status, tcp_connect

if TYPE_CHECKING:
    from levers9.runtime.config import Settings


def launch(home: Home, settings: Settings, progress: Progress) -> Launch:
    port, monitor = procs.free_ports(2)  # looked up on the module: a test hands out a taken port
    store = marker(home.path)
    Path(store).mkdir(parents=True, exist_ok=True)
    cmd = [binary("nats-server"), "-a", LOCALHOST, "-p", str(port), "-js", "-sd", store, "-m", str(monitor)]
    progress(f"nats: starting on {LOCALHOST}:{port}")
    proc, offset = home.spawn("nats", cmd)
    entry = {"pid": proc.pid, "port": port, "monitor_port": monitor, "external": False,
             "url": f"nats://{LOCALHOST}:{port}"}
    return Launch("nats", proc, offset, entry, lambda: healthy(monitor))


def marker(home: Path) -> str:
    return str(home / "nats")


def healthy(monitor_port: int) -> bool:
    return http_status(f"http://{LOCALHOST}:{monitor_port}/healthz?js-enabled-only=true") == 200


def probe(url: str, entry: dict | None) -> bool:
    """Ours: JetStream answers on the monitor port. External: the client port accepts a connection."""
    if entry:
        return healthy(entry["monitor_port"])
    tcp_connect(url, 4222)
    return True


SERVER = Server("nats", launch=launch, marker=marker, probe=probe)
