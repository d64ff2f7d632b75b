"""The NATS launcher: nats-server with JetStream, its data under home/nats/, a monitor port for health.

With `nats_auth = "on"` (what `levers9 up` sets) the server runs in operator mode: the config file
home/nats/auth/server.conf holds the operator and account JWTs (levers9.runtime.nats_issuer), so a
connection without a user JWT signed by the account is refused, and each user gets only the
permissions in its JWT (levers9.runtime.nats_auth). Address, ports and JetStream stay flags.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from . import procs
from .home import Home, Launch, Server
from .procs import LOCALHOST, Progress, binary, http_status, tcp_connect

if TYPE_CHECKING:
    from levers9.runtime.config import Settings
    from levers9.runtime.nats_issuer import Issuer


def launch(home: Home, settings: Settings, progress: Progress) -> Launch:
    port, monitor = procs.free_ports(2)  # looked up on the module: a test hands out a taken port
    store = marker(home.path)
    Path(store).mkdir(parents=True, exist_ok=True)
    cmd = [binary("nats-server"), "-a", LOCALHOST, "-p", str(port), "-js", "-sd", store, "-m", str(monitor)]
    auth = settings.bus.auth is True
    if auth:
        cmd += ["-c", str(write_config(home.path, settings))]
    progress(f"nats: starting on {LOCALHOST}:{port}" + (" with authentication" if auth else ""))
    proc, offset = home.spawn("nats", cmd)
    scheme = "tls" if auth and settings.bus.tls_cert and settings.bus.tls_key else "nats"
    entry = {"pid": proc.pid, "port": port, "monitor_port": monitor, "external": False,
             "url": f"{scheme}://{LOCALHOST}:{port}", "auth": auth}
    return Launch("nats", proc, offset, entry, lambda: healthy(monitor))


def issuer(home: Path) -> Issuer:
    from levers9.runtime.nats_issuer import Issuer

    return Issuer(Path(home) / "nats" / "auth")


def write_config(home: Path, settings: Settings) -> Path:
    """Keys and credentials made if missing, and the server's auth config written from them."""
    iss = issuer(home)
    iss.ensure()
    return iss.write_server_config(tls_cert=settings.bus.tls_cert, tls_key=settings.bus.tls_key)


def reload(home: Path, pid: int, settings: Settings) -> None:
    """Rewrite the auth config (a publisher revoked) and have the running server read it again."""
    write_config(home, settings)
    os.kill(pid, signal.SIGHUP)  # what `nats-server --signal reload=PID` sends


def service_env(home: Path, entry: dict | None, name: str, worker_id: str = "") -> dict[str, str]:
    """LEVERS9_* for service `name` when our NATS runs with auth: its own user, its own signing key,
    everyone's public signing keys; a worker gets a user minted for it alone. {} without auth."""
    from levers9.runtime.nats_auth import ROLES_SERVICES, WORKER

    if not (entry or {}).get("auth") or name not in (*ROLES_SERVICES, WORKER):
        return {}
    iss = issuer(home)
    creds = iss.worker_creds(worker_id) if name == WORKER else iss.creds_path(name)
    env = {"LEVERS9_NATS_AUTH": "on", "LEVERS9_NATS_CREDS": str(creds),
           "LEVERS9_BUS_SIGNING_KEY": str(iss.signing_path(name)), "LEVERS9_BUS_SIGNERS": str(iss.signers_path)}
    if name == "pool-controller":  # it mints each worker's user
        env["LEVERS9_NATS_ISSUER"] = str(iss.dir)
    return env


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
