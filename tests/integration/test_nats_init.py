"""`levers9 nats init DIR` (what docker compose's nats-auth service runs) against a real nats-server
started with the config it writes: each service's user connects and publishes its own subjects; no
credentials, or another account's, are refused; a power event it does not own is refused."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import nats
import nats.errors
import pytest

from levers9.runtime.bus_auth import BusAuth
from levers9.stack import free_port

NATS_SERVER = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")


@pytest.fixture
def server(tmp_path):
    auth = tmp_path / "auth"
    subprocess.run([sys.executable, "-m", "levers9", "nats", "init", str(auth), "--worker", "worker-1"], check=True,
                   capture_output=True)
    port = free_port()
    proc = subprocess.Popen([NATS_SERVER, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path / "js"),
                             "-c", str(auth / "server.conf")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"nats://127.0.0.1:{port}", auth
    finally:
        proc.terminate()
        proc.wait(10)


async def _connect(url: str, creds: Path | None):
    for _ in range(50):  # the server is starting
        try:
            opts = BusAuth(creds=str(creds)).connect_options() if creds else {}
            return await nats.connect(url, allow_reconnect=False, connect_timeout=2, **opts)
        except (OSError, nats.errors.NoServersError):
            await asyncio.sleep(0.1)
    raise AssertionError("nats-server did not start")


async def test_the_config_it_writes_admits_each_service_and_the_static_worker_only(server, tmp_path):
    url, auth = server
    for creds in (auth / "gateway.creds", auth / "pool-controller.creds", auth / "workers" / "worker-1.creds"):
        nc = await _connect(url, creds)
        await nc.flush()
        await nc.close()
    with pytest.raises(Exception, match="(?i)authorization"):
        await _connect(url, None)
    other = tmp_path / "other"
    subprocess.run([sys.executable, "-m", "levers9", "nats", "init", str(other)], check=True, capture_output=True)
    with pytest.raises(Exception, match="(?i)authorization"):
        await _connect(url, other / "gateway.creds")
    # the scheduler may not publish what the gateway owns (a token): the server itself says no
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    opts = BusAuth(creds=str(auth / "scheduler.creds")).connect_options()
    nc = await nats.connect(url, allow_reconnect=False, error_cb=on_error, **opts)
    await nc.publish("levers9.default.token.t1.TokenCreated", b"{}")
    for _ in range(50):
        await nc.flush()
        if any("permissions violation" in e for e in errors):
            break
        await asyncio.sleep(0.05)
    await nc.close()
    assert any("permissions violation" in e and "tokencreated" in e for e in errors), errors
