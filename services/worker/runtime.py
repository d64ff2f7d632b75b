"""Container runtimes of the worker: what runs a user's app, and how we learn that it ended.

Two implementations behind one interface:
- `RuncRuntime` (levers9.worker.runc): a real container per app (runc, overlay root, own network
  namespace on the worker's bridge, cgroup limits). Needs root on Linux.
- `ProcessRuntime` (here): a plain child process. For laptops and tests without root.

`choose_runtime` picks one from `settings.runtime` ("runc" | "process" | "auto").
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from levers9.runtime.config import Settings

if TYPE_CHECKING:
    from levers9.worker.checkpoint import CheckpointArtifact

DEFAULT_COMMAND = ("python3", "-m", "levers9.runner")
CONTAINER_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ContainerSpec:
    container_id: str  # safe id: [A-Za-z0-9_-], up to 128 chars
    code_dir: Path  # host dir with the app files -> read-only at /app
    sdk_dir: Path  # host dir that CONTAINS the package folder `levers9/` -> read-only at /opt/levers9
    env: dict[str, str]  # the process's environment (plus PYTHONPATH, HOME, PATH)
    cpu_millicores: int
    memory_mib: int
    command: tuple[str, ...] = DEFAULT_COMMAND
    port: int = 8000  # where the process listens inside the container

    def __post_init__(self) -> None:
        if not CONTAINER_ID.match(self.container_id):
            raise ValueError(f"container id {self.container_id!r} must be 1-128 of [A-Za-z0-9_-]")
        if not self.command:
            raise ValueError("command must not be empty")
        for key in self.env:
            if not key or "=" in key or "\0" in key:
                raise ValueError(f"bad environment variable name {key!r}")


@dataclass(frozen=True)
class Started:
    address: str  # "http://IP:PORT" the gateway on this host can reach
    pid: int  # host pid of the container's init process
    log_path: Path  # host path of the container's combined stdout/stderr log


@dataclass(frozen=True)
class Exit:
    code: int | None  # exit status, None if unknown
    reason: str  # a sentence: "exited with status 3", "killed: out of memory (limit 64 MiB)", "stopped"
    oom: bool = False


class ContainerError(RuntimeError):
    """A container could not be started (the message says why)."""


def exit_of(code: int | None, *, oom: bool = False, memory_mib: int | None = None,
            stop_requested: bool = False) -> Exit:
    """The Exit for what we know about an ended process (pure).

    `code` follows the shell convention: 128+N for "killed by signal N".
    """
    if oom:
        limit = f" (limit {memory_mib} MiB)" if memory_mib else ""
        return Exit(code, f"killed: out of memory{limit}", oom=True)
    if stop_requested:
        return Exit(code, "stopped")
    if code is None:
        return Exit(None, "ended without an exit status (killed from outside the container)")
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = "unknown signal"
        return Exit(code, f"killed by signal {code - 128} ({name})")
    return Exit(code, f"exited with status {code}")


class Runtime(ABC):
    name: str
    features: list[str]

    def __init__(self, state_dir: Path, settings: Settings):
        self.state_dir = Path(state_dir).resolve()
        self.settings = settings

    @property
    def containers_dir(self) -> Path:
        return self.state_dir / "containers"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @abstractmethod
    async def prepare(self, progress: Progress = lambda s: None) -> None:
        """Make what every container needs (idempotent)."""

    @abstractmethod
    async def start(self, spec: ContainerSpec) -> Started:
        """Start the process; returns once it runs (it may not listen yet: the caller polls)."""

    @abstractmethod
    async def poll(self, container_id: str) -> Exit | None:
        """None while it runs; its Exit once it ended (by itself, out of memory, or killed)."""

    @abstractmethod
    async def stop(self, container_id: str, timeout: float = 10) -> Exit:
        """SIGTERM, wait `timeout`, SIGKILL; then remove all of it but the log. Idempotent."""

    @abstractmethod
    def log_path(self, container_id: str) -> Path:
        """The container's combined stdout/stderr, also after it was stopped."""

    @abstractmethod
    async def cleanup_all(self) -> list[str]:
        """Remove what a previous run of this worker (same state_dir) left; their ids."""

    @abstractmethod
    def running(self) -> list[str]:
        """Ids started by this runtime object and not stopped yet."""

    # -- checkpoint/restore: optional (the runc runtime with CRIU has them) --

    @property
    def checkpoint_ready(self) -> bool:
        """Whether checkpoint() and restore() can work here now."""
        return False

    async def checkpoint(self, container_id: str, out_tar: Path) -> "CheckpointArtifact":
        """Dump the running container into one tar, leaving it running (CheckpointError)."""
        raise NotImplementedError(f"the {self.name} runtime cannot checkpoint")

    async def restore(self, spec: ContainerSpec, tar: Path) -> Started:
        """Start `spec.container_id` from a checkpoint tar instead of booting (RestoreError)."""
        raise NotImplementedError(f"the {self.name} runtime cannot restore a checkpoint")


def choose_runtime(settings: Settings, state_dir: Path) -> tuple[Runtime, str]:
    """The runtime `settings.runtime` asks for, and a sentence for the worker's log."""
    wanted = settings.runtime
    missing = runc_missing()
    if wanted == "runc" or (wanted == "auto" and not missing):
        if missing:
            raise ContainerError(f"runtime 'runc' is not available here: {missing}")
        from levers9.worker.runc import RuncRuntime  # runc.py imports this module

        return RuncRuntime(state_dir, settings), "runc runtime: containers with their own root, " \
                                                 "network namespace and cgroup limits"
    if wanted in ("process", "auto"):
        why = "asked for" if wanted == "process" else missing
        return ProcessRuntime(state_dir, settings), \
            f"process runtime: no isolation and no checkpoints ({why})"
    raise ContainerError(f"unknown runtime {wanted!r}: use runc, process or auto")


def runc_missing() -> str | None:
    """Why runc cannot be used here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "runc needs Linux"
    if os.geteuid() != 0:
        return "runc needs root"
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    for tool in ("runc", "ip"):
        if not shutil.which(tool, path=path):
            return f"{tool} is not installed"
    return None


# ---- ProcessRuntime --------------------------------------------------------------------------------

@dataclass
class _Process:
    spec: ContainerSpec
    popen: subprocess.Popen
    log: Path
    stop_requested: bool = False
    ended: Exit | None = None


class ProcessRuntime(Runtime):
    """Plain child processes: NO isolation (the app sees the host's files, network and processes)
    and NO limits (cpu_millicores and memory_mib are ignored), no checkpoints.

    Each app runs in its own session, cwd = code_dir, with PYTHONPATH=sdk_dir and "python3" replaced
    by this interpreter. It listens on 127.0.0.1 at a free port, told by LEVERS9_RUNNER_HOST and
    LEVERS9_RUNNER_PORT (`spec.port` is ignored here); LEVERS9_RUNNER_APP_DIR is code_dir unless
    spec.env says otherwise. Its output goes to `<state_dir>/logs/<id>.log`.
    """

    name = "process"
    features = ["process"]

    def __init__(self, state_dir: Path, settings: Settings):
        super().__init__(state_dir, settings)
        self._procs: dict[str, _Process] = {}

    async def prepare(self, progress: Progress = lambda s: None) -> None:
        self.containers_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)

    def log_path(self, container_id: str) -> Path:
        return self.logs_dir / f"{container_id}.log"

    async def start(self, spec: ContainerSpec) -> Started:
        if spec.container_id in self._procs:
            raise ContainerError(f"container {spec.container_id} exists already")
        await self.prepare()
        port = _free_port()
        command = list(spec.command)
        if command[0] in ("python3", "python"):
            command[0] = sys.executable
        sdk = str(Path(spec.sdk_dir).resolve())
        env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
               "HOME": os.environ.get("HOME", "/root"),
               "LEVERS9_RUNNER_APP_DIR": str(Path(spec.code_dir).resolve()),  # not /app here
               **spec.env,
               "PYTHONPATH": sdk + (":" + spec.env["PYTHONPATH"] if spec.env.get("PYTHONPATH") else ""),
               "LEVERS9_RUNNER_HOST": "127.0.0.1", "LEVERS9_RUNNER_PORT": str(port)}
        log = self.log_path(spec.container_id)
        with open(log, "ab") as out:
            try:
                popen = subprocess.Popen(command, cwd=spec.code_dir, env=env, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                raise ContainerError(f"cannot start {command[0]}: {exc}") from exc
        cdir = self.containers_dir / spec.container_id
        cdir.mkdir(parents=True, exist_ok=True)
        (cdir / "state.json").write_text(json.dumps({"pid": popen.pid, "started": _start_time(popen.pid)}))
        self._procs[spec.container_id] = _Process(spec, popen, log)
        return Started(address=f"http://127.0.0.1:{port}", pid=popen.pid, log_path=log)

    async def poll(self, container_id: str) -> Exit | None:
        proc = self._procs.get(container_id)
        if proc is None:
            raise KeyError(container_id)
        if proc.ended:
            return proc.ended
        rc = proc.popen.poll()
        if rc is None:
            return None
        proc.ended = exit_of(rc if rc >= 0 else 128 - rc, stop_requested=proc.stop_requested)
        return proc.ended

    async def stop(self, container_id: str, timeout: float = 10) -> Exit:
        proc = self._procs.get(container_id)
        if proc is None:
            return Exit(None, "stopped")  # never started here, or stopped already and forgotten
        if proc.popen.poll() is None:
            proc.stop_requested = True
            _killpg(proc.popen.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while proc.popen.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if proc.popen.poll() is None:
                _killpg(proc.popen.pid, signal.SIGKILL)
                await asyncio.to_thread(proc.popen.wait)
        _killpg(proc.popen.pid, signal.SIGKILL)  # what the app left behind in its session
        ended = await self.poll(container_id)
        shutil.rmtree(self.containers_dir / container_id, ignore_errors=True)
        assert ended is not None
        return ended

    async def cleanup_all(self) -> list[str]:
        found = []
        if not self.containers_dir.is_dir():
            return found
        for cdir in sorted(self.containers_dir.iterdir()):
            if cdir.name in self._procs:
                continue
            try:
                state = json.loads((cdir / "state.json").read_text())
                if _start_time(state["pid"]) == state["started"]:  # still ours, not a reused pid
                    _killpg(state["pid"], signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass
            shutil.rmtree(cdir, ignore_errors=True)
            found.append(cdir.name)
        return found

    def running(self) -> list[str]:
        return [cid for cid, p in self._procs.items() if p.popen.poll() is None]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
