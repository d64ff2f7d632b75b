"""Helpers of the end-to-end tests: run the real CLI, wait for a condition."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Iterator

import httpx


def cli(env: dict, *args: str, timeout: float = 900, check: bool = True, python: str = sys.executable,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`levers9 ARGS` as a user runs it, in `env` (its LEVERS9_HOME); raises with its output on failure.
    `python`: the interpreter whose levers9 runs (another venv's, test_e2e_wheel)."""
    proc = subprocess.run([python, "-m", "levers9", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"levers9 {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


PATIENCE_UP_TO_S = 180.0  # a short ceiling is raised up to this (3x): only a failing wait takes longer


def ceiling(timeout: float) -> float:
    """The time a wait is given: its ceiling, short ones tripled up to PATIENCE_UP_TO_S. CI runs on a
    machine still busy with other work (load 10-14 seen): a process started under it took 60 s to
    connect (an attached cluster's agent) where it takes 2 s alone. A ceiling only guards against a
    wait that would never end; the condition is what is waited on."""
    return timeout if timeout >= PATIENCE_UP_TO_S else min(timeout * 3, PATIENCE_UP_TO_S)


def wait_until(fn, timeout: float = 30.0, every: float = 0.2):
    """fn's first truthy value, polled; AssertionError when none comes in time (see `ceiling`)."""
    deadline = time.monotonic() + ceiling(timeout)
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not reached in time")


def api(env: dict, method: str, path: str, **kw) -> httpx.Response:
    """A gateway call with the profile's token, as a user's HTTP client makes it."""
    p = tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())
    return httpx.request(method, p["gateway_url"] + path, headers={"Authorization": f"Bearer {p['token']}"},
                         timeout=kw.pop("timeout", 180), **kw)


def bus_auth(env: dict):  # -> levers9.runtime.bus_auth.BusAuth
    """This home's admin credentials and event key (`levers9 up` runs NATS with auth), as its CLI uses them."""
    from levers9.runtime.bus_auth import BusAuth
    from levers9.runtime.config import Settings

    return BusAuth.from_settings(Settings.load(env={"LEVERS9_HOME": env["LEVERS9_HOME"]}))


def needs_runc() -> None:
    """Skip the module unless runc containers can run here (root and runc)."""
    import os

    import pytest

    if os.geteuid() != 0 or not any(Path(p, "runc").exists() for p in os.environ.get("PATH", "").split(":")):
        pytest.skip("runc sandboxes need root and runc (scripts/setup.sh installs runc)", allow_module_level=True)


@contextlib.contextmanager
def one_worker_stack(home: Path, cpu_millicores: int, memory_mib: int, python: str = sys.executable,
                     base_env: dict | None = None, cwd: Path | None = None) -> Iterator[dict]:
    """`levers9 up` in `home` with one local worker of that size, until it is ready; `levers9 down` after.
    The CLI is `python`'s, run in `cwd` with `base_env` (default: this process's) less its LEVERS9_*."""
    import os

    from levers9.runtime.ports import free_port

    # LEVERS9_E2E_BACKEND=netns: the worker is its own host (its own network namespace and address,
    # levers9.runtime.hosts), and `levers9 up`'s own worker sits in a pool no request names
    backend = os.environ.get("LEVERS9_E2E_BACKEND", "local")
    pools = home / "pools.toml"
    pools.write_text(f'[pools.default]\nbackend = "{backend}"\nmin_warm = 1\nmax_workers = 1\nidle_timeout_s = 600\n'
                     f'worker_cpu_millicores = {cpu_millicores}\nworker_memory_mib = {memory_mib}\n')
    env = {k: v for k, v in (os.environ if base_env is None else base_env).items() if not k.startswith("LEVERS9_")}
    # its own node cache port from the ledger: the default (2050) may be another stack's
    env.update(LEVERS9_HOME=str(home), LEVERS9_POOLS_FILE=str(pools), LEVERS9_CACHE_PORT=str(free_port()),
               LEVERS9_WORKER_CPU_MILLICORES=str(cpu_millicores), LEVERS9_WORKER_MEMORY_MIB=str(memory_mib),
               **({"LEVERS9_WORKER_POOL": "machine"} if backend != "local" else {}))
    try:
        cli(env, "up", python=python, cwd=cwd)
        wait_until(lambda: any(w["status"] == "ready" and "runc" in w["features"] and w["pool"] == "default"
                               for w in api(env, "GET", "/api/v1/workers").json()), timeout=600)
        yield env
    finally:
        cli(env, "down", check=False, python=python, cwd=cwd)
