"""Ports for servers and workers on this machine, chosen so that nothing else takes them before their
process binds them."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import random
import socket
import threading
import time
from pathlib import Path

LOCALHOST = "127.0.0.1"
PORT_FLOOR = 20000  # servers' ports are chosen from here up to the kernel's ephemeral range
HOLD_S = 300.0  # a port handed out is not handed out again for this long: its server has bound it by then
HANDED: dict[int, float] = {}  # port -> when this process handed it out
# The machine's ledger: a file per port handed out by any process of this user (its mtime: when),
# written under a lock on the folder. The pytest lanes, a second `levers9 up` and every worker choose
# ports, and a port one had chosen but whose server had not bound it yet was chosen by another (CI's
# loaded run: a stack's node cache port went to another lane's worker, and that stack's worker exited).
LEDGER = Path(f"/tmp/levers9-ports-{os.getuid()}")
_HANDED_LOCK = threading.Lock()


def free_port(host: str = LOCALHOST) -> int:
    return free_ports(1, host)[0]


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (and bind to port 0)."""
    try:
        low, high = map(int, path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int, host: str = LOCALHOST) -> list[int]:
    """`count` distinct free ports: all sockets are held until every port is chosen. They come from
    below the ephemeral range: a port the kernel would give (bind to 0) can be taken by any outgoing
    connection between choosing it and the server's bind (seen in CI: weed's gRPC port, "address
    already in use", beside a stack with many client connections). A port handed out is not handed
    out again for HOLD_S, by this process or another on the machine (LEDGER): `levers9 up` launches
    every server before waiting for any, so weed's filer had not yet bound its port when NATS's ports
    were chosen (seen in CI too). Port 0 only when none is free there."""
    low = ephemeral_range()[0]
    pool = range(PORT_FLOOR, low) if low - PORT_FLOOR >= 1000 else range(0)
    candidates = random.sample(pool, min(len(pool), max(64, count * 8)))
    with _HANDED_LOCK, contextlib.ExitStack() as stack:
        _forget_old(time.monotonic())
        machine = stack.enter_context(_MachineLedger.locked(LEDGER))
        ports: list[int] = []
        # port 0 at most 64 times a port: the kernel may give back one just handed out
        fresh = (p for p in candidates if p not in HANDED)
        for port in itertools.chain(fresh, itertools.repeat(0, 64 * count)):
            if len(ports) == count:
                break
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind((host, port))
            except OSError:  # in use (or lingering): the next one
                continue
            chosen = sock.getsockname()[1]
            if chosen in HANDED or chosen in ports or not machine.take(chosen):
                continue  # another process chose it lately (or the kernel gave one back again)
            ports.append(chosen)
        HANDED.update(dict.fromkeys(ports, time.monotonic()))
        return ports


def claim_port(port: int) -> bool:
    """Mark `port` (a server's port of an earlier run, reused) as handed out; False when this
    process, or another on the machine, handed it to another server within HOLD_S."""
    with _HANDED_LOCK, _MachineLedger.locked(LEDGER) as machine:
        _forget_old(time.monotonic())
        if port in HANDED or not machine.take(port):
            return False
        HANDED[port] = time.monotonic()
        return True


def _forget_old(now: float) -> None:
    """A long-running worker hands out a port per process container: keep the ledger bounded."""
    for port in [p for p, at in HANDED.items() if now - at > HOLD_S]:
        del HANDED[port]


class _MachineLedger:
    """The ledger's folder, held under its lock by one process at a time. Without a usable folder (a
    read-only /tmp) only this process's own ledger counts."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    @classmethod
    @contextlib.contextmanager
    def locked(cls, folder: Path):
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(folder, os.O_RDONLY)
        except OSError:
            yield cls(None)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when closed
            yield cls(folder)
        finally:
            os.close(fd)

    def take(self, port: int) -> bool:
        """True, and the port is this process's for HOLD_S, unless another took it within HOLD_S."""
        if self.folder is None:
            return True
        path = self.folder / str(port)
        try:
            if time.time() - path.stat().st_mtime <= HOLD_S:
                return False
        except FileNotFoundError:
            pass
        try:
            path.touch()
        except OSError:
            pass
        return True
