"""Helpers of the end-to-end tests: run the real CLI, wait for a condition."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx


def cli(env: dict, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    """`levers9 ARGS` as a user runs it, in `env` (its LEVERS9_HOME); raises with its output on failure."""
    proc = subprocess.run([sys.executable, "-m", "levers9", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"levers9 {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def wait_until(fn, timeout: float = 30.0, every: float = 0.2):
    """fn's first truthy value, polled; AssertionError when none comes in time."""
    deadline = time.monotonic() + timeout
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
