"""What the soak measures besides RSS and consumers: connections (NATS clients, Postgres
sessions), disk (the home's bytes per part) and container directories left on the node."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import asyncpg
import httpx


def nats_connections(monitor_port: int) -> int:
    """Clients connected to NATS, from its monitor port (/connz)."""
    r = httpx.get(f"http://127.0.0.1:{monitor_port}/connz", timeout=5)
    return int(r.json()["num_connections"])


async def _pg_sessions(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:  # the probe's own session is not counted
        return int(await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                       "AND pid <> pg_backend_pid()"))
    finally:
        await conn.close()


def pg_sessions(database_url: str) -> int:
    return asyncio.run(_pg_sessions(database_url))


def connections(home: Path) -> dict[str, int]:
    state = json.loads((home / "state.json").read_text())
    return {"nats clients": nats_connections(state["components"]["nats"]["monitor_port"]),
            "postgres sessions": pg_sessions(state["database_url"])}


def du(path: Path) -> int:
    total = 0
    for root, dirs, files in os.walk(path, onerror=lambda _: None):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                continue
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(root, d))]  # not into container roots
    return total


def disk(home: Path) -> dict[str, int]:
    """Bytes on disk per part of the home (a mounted container root is not descended into)."""
    parts = {name: du(home / name) for name in ("nats", "postgres", "s3", "workers", "logs", "registry")
             if (home / name).exists()}
    return parts


def container_dirs(home: Path) -> int:
    """Container directories on the node (each running or just stopped container has one)."""
    return sum(1 for d in (home / "workers").glob("*/containers/*") if d.is_dir())
