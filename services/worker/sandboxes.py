"""The worker's side of Python function sandboxes (code.kind "function").

A sandbox is a container whose runner also runs the executor (levers9.executor). The worker gives
it three binds (its socket directory, cloudpickle beside the SDK, the node's cache of per-sandbox
package installs), checks the executor's protocol generation before calling it ready, and lets the
gateway reach the executor through its relay (executor_relay.py): the address published in
ContainerReady is the relay's, not the container's.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from levers9.contracts.spec import DeploymentSpec
from levers9.executor import packages, wire
from levers9.runtime.config import Settings

from .executor_relay import Relay, executor_hello, vendor_dir

log = logging.getLogger("levers9.worker.sandboxes")


def is_function(spec: DeploymentSpec | None) -> bool:
    return spec is not None and spec.code.kind == "function"


def generation_refusal(spec: DeploymentSpec) -> str:
    """Why this worker cannot run the sandbox the spec asks for ("" when it can)."""
    wanted = spec.function.executor_generation if spec.function else wire.GENERATION
    if wanted in wire.SUPPORTED_GENERATIONS:
        return ""
    return (f"the function asks for executor protocol generation {wanted}; this worker implements "
            f"{sorted(wire.SUPPORTED_GENERATIONS)}: upgrade the worker or deploy with this platform's SDK")


class Sandboxes:
    def __init__(self, settings: Settings, state_dir: Path) -> None:
        self.settings = settings
        # short: a unix socket's path must fit in 108 bytes, and a home's path may be long
        self.root = Path(tempfile.gettempdir()) / "levers9-sb" / hashlib.sha256(str(state_dir).encode()).hexdigest()[:8]
        self.ready: dict[str, Path] = {}  # container id -> its executor socket, once ready
        self.relay = Relay(self.ready.get)
        self.port = 0
        self.server: asyncio.Server | None = None

    async def serve(self, stop: asyncio.Event) -> None:
        host = self.settings.http_host
        self.server = await asyncio.start_server(self.relay.serve, host, self.settings.relay_port, limit=1 << 20)
        self.port = self.server.sockets[0].getsockname()[1]
        log.info("executor relay listening on %s:%d", host, self.port)
        try:
            await stop.wait()
        finally:
            self.server.close()

    def container_fields(self, container_id: str, workspace: str) -> dict[str, Any]:
        """The ContainerSpec fields of a function sandbox (its socket directory made afresh)."""
        executor_dir = self.root / container_id
        shutil.rmtree(executor_dir, ignore_errors=True)
        executor_dir.mkdir(parents=True)
        executor_dir.chmod(0o777)  # the sandbox's user creates its socket here
        packages = Path(self.settings.image_cache) / "packages" / workspace  # per workspace: no cross-tenant cache
        packages.mkdir(parents=True, exist_ok=True)
        return {"executor_dir": executor_dir, "vendor_dir": vendor_dir(self.settings.home_path),
                "packages_dir": packages}

    async def preinstall(self, spec: DeploymentSpec, packages_dir: Path) -> None:
        """Install the function's `packages=` for its sandboxes on the host side: sandboxes reach no
        network, this worker does (with its pip configuration). The directory and its marker are the
        executor's own (levers9.executor.packages), so the sandbox finds them and installs nothing.
        Only when this worker's Python is the sandbox's (pip picks wheels for the running one)."""
        requirements = list(spec.function.packages) if spec.function else []
        python = tuple(int(x) for x in self.settings.sandbox_python.split(".")[:2])
        if not requirements or python != sys.version_info[:2]:
            return
        target = packages_dir / packages.packages_key(requirements, python)  # type: ignore[arg-type]
        if (target / packages.MARKER).exists():
            return
        await asyncio.to_thread(self._install, requirements, target)

    @staticmethod
    def _install(requirements: list[str], target: Path) -> None:
        with open(target.parent / f"{target.name}.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (target / packages.MARKER).exists():  # another worker of this node did it meanwhile
                return
            shutil.rmtree(target, ignore_errors=True)
            began = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                                   "--progress-bar", "off", "--target", str(target), *requirements],
                                  capture_output=True, text=True, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
                raise RuntimeError(f"installing packages {' '.join(requirements)} failed: {tail}")
            (target / packages.MARKER).write_text(" ".join(requirements) + "\n")
            os.chmod(target, 0o755)
            log.info("installed %s for sandboxes in %.1f s", " ".join(requirements), time.monotonic() - began)

    async def ready_address(self, container_id: str) -> str:
        """The relay address of a sandbox whose executor answered with a generation this worker
        speaks; ProtocolError (with what to do) when it does not, OSError when it does not answer."""
        sock = self.root / container_id / wire.SOCKET_NAME
        hello = await executor_hello(sock)
        self.ready[container_id] = sock
        log.info("sandbox %s: executor generation %s, Python %s", container_id, hello.get("generation"),
                 hello.get("python"))
        return wire.relay_address(self.settings.http_host, self.port, container_id, self.relay.key(container_id))

    def forget(self, container_id: str) -> None:
        self.ready.pop(container_id, None)
        shutil.rmtree(self.root / container_id, ignore_errors=True)
