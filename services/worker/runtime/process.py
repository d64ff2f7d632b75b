"""ProcessRuntime: each app as a plain child process, for laptops and tests without root."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from levers9.runtime.config import Settings
from levers9.runtime.off_loop import remove_tree
from levers9.runtime.ports import free_port

from .interface import ContainerError, ContainerSpec, Exit, Progress, Runtime, Started, exit_of, start_time


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
        port = free_port()
        command = list(spec.command)
        if command[0] in ("python3", "python"):
            command[0] = sys.executable
        log = self.log_path(spec.container_id)
        popen = _spawn(command, spec, process_env(spec, port), log)
        cdir = self.containers_dir / spec.container_id
        cdir.mkdir(parents=True, exist_ok=True)
        (cdir / "state.json").write_text(json.dumps({"pid": popen.pid, "started": start_time(popen.pid)}))
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
        await remove_tree(self.containers_dir / container_id)
        assert ended is not None
        return ended

    async def cleanup_all(self) -> list[str]:
        found: list[str] = []
        if not self.containers_dir.is_dir():
            return found
        for cdir in sorted(self.containers_dir.iterdir()):
            if cdir.name in self._procs:
                continue
            try:
                state = json.loads((cdir / "state.json").read_text())
                if start_time(state["pid"]) == state["started"]:  # still ours, not a reused pid
                    _killpg(state["pid"], signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass
            await remove_tree(cdir)
            found.append(cdir.name)
        return found

    def running(self) -> list[str]:
        return [cid for cid, p in self._procs.items() if p.popen.poll() is None]


def process_env(spec: ContainerSpec, port: int) -> dict[str, str]:
    """The app's environment: the host's PATH and HOME, spec.env, the SDK first on PYTHONPATH, and
    where to listen (pure)."""
    sdk = str(Path(spec.sdk_dir).resolve()) + (f":{Path(spec.vendor_dir).resolve()}" if spec.vendor_dir else "")
    executor = {"LEVERS9_EXECUTOR_SOCKET": str(Path(spec.executor_dir) / "executor.sock")} if spec.executor_dir else {}
    if spec.packages_dir:
        executor["LEVERS9_EXECUTOR_PACKAGES_DIR"] = str(spec.packages_dir)
    return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LEVERS9_RUNNER_APP_DIR": str(Path(spec.code_dir).resolve()),  # not /app here
            **spec.env, **executor, **(spec.gpu.env if spec.gpu else {}),  # its cards (levers9.worker.gpus.cards)
            "PYTHONPATH": sdk + (":" + spec.env["PYTHONPATH"] if spec.env.get("PYTHONPATH") else ""),
            "LEVERS9_RUNNER_HOST": "127.0.0.1", "LEVERS9_RUNNER_PORT": str(port)}


def _spawn(command: list[str], spec: ContainerSpec, env: dict[str, str], log: Path) -> subprocess.Popen:
    """fork+exec returns at once (the app runs on): no thread needed."""
    with open(log, "ab") as out:
        try:
            return subprocess.Popen(command, cwd=spec.code_dir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise ContainerError(f"cannot start {command[0]}: {exc}") from exc


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
