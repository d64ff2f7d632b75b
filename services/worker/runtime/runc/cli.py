"""The runc command line as the runc runtime uses it, and what it keeps per container.

runc's state lives in `<state_dir>/runc` (`runc --root`), so workers of one machine never see each
other's containers. `Record` is what stop() and cleanup_all() need after a restart of the worker
(saved as `state.json` in the container dir).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from levers9.worker.checkpoints import archive as ckpt
from levers9.worker.runtime.interface import ContainerError


@dataclass
class Record:
    container_id: str
    ip: str
    port: int
    memory_mib: int
    pid: int = 0
    started: int | None = None  # the init's start time (tells a reused pid apart)
    stop_requested: bool = False
    root_mounted_at: float = 0.0  # wall clock when its root (the image, or the base) was mounted


class RuncCli:
    def __init__(self, binary: str, root: Path) -> None:
        self.binary = binary
        self.root = root

    async def cmd(self, *args: str) -> tuple[int, str, str]:
        """`runc --root ROOT args...`: (exit status, stdout, stderr)."""
        proc = await asyncio.create_subprocess_exec(
            self.binary, "--root", str(self.root), *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        return proc.returncode or 0, out.decode(), err.decode()

    async def run_detached(self, cid: str, cdir: Path) -> None:
        """`runc run -d` of the bundle in `cdir`; its init's pid lands in `cdir/init.pid`."""
        # stdio of runc is /dev/null: the container inherits it (and our pipes would never close);
        # runc's errors go to its --log file
        log = cdir / "runc.log"
        proc = await asyncio.create_subprocess_exec(
            self.binary, "--root", str(self.root), "--log", str(log), "--log-format", "json",
            "run", "-d", "--bundle", str(cdir), "--pid-file", str(cdir / "init.pid"), cid,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        if await proc.wait() != 0:
            raise ContainerError(f"runc run {cid} failed: {runc_error(log)}")

    async def state(self, cid: str) -> dict | None:
        """runc's state of the container, None when it does not exist."""
        rc, out, _ = await self.cmd("state", cid)
        if rc != 0:
            return None
        try:
            return json.loads(out)
        except ValueError:
            return None

    async def watched(self, args: list[str], criu_log: Path, timeout: float, log_limit: int,
                      on_kill: Callable[[], Awaitable[None]]) -> str | None:
        """Run `runc <args>` (a checkpoint or restore) under a watchdog; None when it succeeded,
        else "" (read the logs) or why the watchdog killed it.

        Why a watchdog: CRIU 4.2.1 restoring a truncated pages image spins forever in its
        restorer, logging two lines per turn at runc's fixed log level 4 (18 GB in 10 minutes,
        seen here). runc and CRIU run in their own session, so the kill reaches CRIU's helpers;
        `on_kill` then removes what else was left (a restore's half-restored tasks)."""
        proc = await asyncio.create_subprocess_exec(
            self.binary, "--root", str(self.root), *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True)
        deadline = time.monotonic() + timeout
        why = "cancelled"
        try:
            while True:
                try:
                    rc = await asyncio.wait_for(proc.wait(), 0.05)
                except asyncio.TimeoutError:
                    pass
                else:
                    why = ""
                    return None if rc == 0 else ""
                if time.monotonic() > deadline:
                    why = f"it ran longer than {timeout:.0f} s and was killed"
                    return why
                if _size(criu_log) > log_limit:
                    why = f"its log grew past {log_limit >> 20} MiB (CRIU looping) and it was killed"
                    return why
        finally:
            if why:  # killed by the watchdog, or we were cancelled: leave nothing running
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                await proc.wait()
                await on_kill()


def runc_error(log: Path) -> str:
    """The error lines of runc's json log, or its tail."""
    try:
        lines = log.read_text().splitlines()
    except OSError:
        return "(no runc log)"
    errors = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("level") in ("error", "fatal"):
            errors.append(entry.get("msg", ""))
    return "; ".join(errors) or " | ".join(lines[-3:]) or "(empty runc log)"


def criu_reason(criu_log: Path, runc_log: Path) -> str:
    """CRIU's own error lines, or runc's when CRIU left no log (it crashed or never ran)."""
    if criu_log.exists():
        return ckpt.criu_error(criu_log)
    return runc_error(runc_log)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


async def nothing() -> None:
    """An on_kill with nothing to remove."""
