"""The worker's side of Python function sandboxes (code.kind "function").

A sandbox is a container whose runner also runs the executor (levers9.executor). The worker gives
it three binds (its socket directory, cloudpickle beside the SDK, the node's cache of package
installs for its workspace and image), checks the executor's protocol generation before calling it
ready, and lets the gateway reach the executor through its relay (executor_relay.py): the address
published in ContainerReady is the relay's, not the container's.

A function's `packages=` is tenant code (a setup.py runs when pip builds an sdist): it is installed
in a one-off install container (`install_spec`, a bundle.JobSpec: the sandbox's image, runc,
capabilities and seccomp, a network namespace whose one way out is the worker's egress proxy to the
package indexes), never by this process. Nothing the tenant wrote is read here but the install's
log, through `read_tail` (no symlink followed).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from levers9.contracts.spec import DeploymentSpec, ImageRef
from levers9.contracts.volumes import Bind
from levers9.executor import packages, wire
from levers9.runtime.config import Settings
from levers9.worker.builds.buildah import Mount, host_pip_mounts
from levers9.worker.network.egress import proxy_env
from levers9.worker.network.egress_proxy import Egress
from levers9.worker.runtime.interface import ContainerSpec, Exit, Runtime
from levers9.worker.runtime.runc.bundle import LOG_FILE, JobSpec
from levers9.worker.runtime.runc.runc_runtime import RuncRuntime

from .executor_relay import Relay, executor_hello, vendor_dir

log = logging.getLogger("levers9.worker.sandboxes.sandboxes")

INSTALL_TIMEOUT_S = 900.0  # an install that runs longer is killed and fails the sandbox's start
INSTALL_MEMORY_MIB = 1024  # at least this for an install (pip and a build backend), whatever the sandbox has
POLL_S = 0.1
TAIL_BYTES = 8192


def is_function(spec: DeploymentSpec | None) -> bool:
    return spec is not None and spec.code.kind == "function"


def generation_refusal(spec: DeploymentSpec) -> str:
    """Why this worker cannot run the sandbox the spec asks for ("" when it can)."""
    wanted = spec.function.executor_generation if spec.function else wire.GENERATION
    if wanted in wire.SUPPORTED_GENERATIONS:
        return ""
    return (f"the function asks for executor protocol generation {wanted}; this worker implements "
            f"{sorted(wire.SUPPORTED_GENERATIONS)}: upgrade the worker or deploy with this platform's SDK")


def sockets_root() -> Path:
    """Where the sandboxes' socket directories live: root's /run (never a shared /tmp, where another
    local user could have made the path first), or the temporary directory of an unprivileged worker
    (the process runtime). Short: a unix socket's path must fit in 108 bytes."""
    return Path("/run/levers9/sb") if os.geteuid() == 0 else Path(tempfile.gettempdir()) / "levers9-sb"


class Sandboxes:
    def __init__(self, settings: Settings, state_dir: Path) -> None:
        self.settings = settings
        self.root = sockets_root() / hashlib.sha256(str(state_dir).encode()).hexdigest()[:8]
        self.ready: dict[str, Path] = {}  # container id -> its executor socket, once ready
        self.relay = Relay(self.ready.get)
        self.port = 0
        self.server: asyncio.Server | None = None
        self.pip: tuple[list[Mount], list[str]] = host_pip_mounts()  # what pip on this host reads
        self.egress = Egress(settings, state_dir)  # installs' (and this worker's build steps') one way out

    async def serve(self, stop: asyncio.Event) -> None:
        host = self.settings.process.http_host
        self.server = await asyncio.start_server(self.relay.serve, host, self.settings.functions.relay_port, limit=1 << 20)
        self.port = self.server.sockets[0].getsockname()[1]
        log.info("executor relay listening on %s:%d", host, self.port)
        try:
            await stop.wait()
        finally:
            self.server.close()

    def container_fields(self, container_id: str, workspace: str, image: ImageRef | None = None) -> dict[str, Any]:
        """The ContainerSpec fields of a function sandbox (its socket directory made afresh)."""
        executor_dir = self.root / container_id
        shutil.rmtree(executor_dir, ignore_errors=True)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)  # nobody but this worker reaches the sandboxes' directories from the host
        executor_dir.mkdir()
        executor_dir.chmod(0o777)  # the sandbox's user (any uid of its image) creates its socket here
        return {"executor_dir": executor_dir, "vendor_dir": vendor_dir(self.settings.home_path),
                "packages_dir": self.packages_dir(workspace, image)}

    def packages_dir(self, workspace: str, image: ImageRef | None) -> Path:
        """The node's installs for one workspace and one image (the key inside adds the Python and the
        requirements): one tenant's cache never feeds another's container, nor another image's."""
        path = Path(self.settings.images.image_cache) / "packages" / cache_name(workspace) / image_key(image)
        path.mkdir(parents=True, exist_ok=True)
        return path

    async def preinstall(self, cspec: ContainerSpec, spec: DeploymentSpec, runtime: Runtime) -> None:
        """Install the function's `packages=` for its sandboxes in a one-off install container (tenant
        code: a setup.py runs there) with the sandbox's confinement and the egress proxy as its one
        way out, into the cache the sandbox binds; the sandbox then finds it and installs nothing.
        The process runtime confines nothing: its sandboxes install for themselves."""
        requirements = list(spec.function.packages) if spec.function else []
        if not requirements or cspec.packages_dir is None or not runtime.capabilities.confined_jobs:
            return
        assert isinstance(runtime, RuncRuntime)  # the one runtime with confined job containers
        python = tuple(int(x) for x in self.settings.functions.sandbox_python.split(".")[:2])
        done = cspec.packages_dir / packages.packages_key(requirements, python) / packages.MARKER  # type: ignore[arg-type]
        if cspec.image is None and os.path.lexists(done):  # the base's Python: the key is known here
            return
        job = install_spec(cspec, requirements, await self.egress.ready(), self.pip)
        began = time.monotonic()
        ended, tail = await run_job(runtime, job, INSTALL_TIMEOUT_S)
        if ended.code != 0:
            raise RuntimeError(f"installing packages {' '.join(requirements)} failed ({ended.reason}): {tail}")
        log.info("installed %s for sandboxes in an install container in %.1f s", " ".join(requirements),
                 time.monotonic() - began)

    async def ready_address(self, container_id: str) -> str:
        """The relay address of a sandbox whose executor answered with a generation this worker
        speaks; ProtocolError (with what to do) when it does not, OSError when it does not answer."""
        sock = self.root / container_id / wire.SOCKET_NAME
        hello = await executor_hello(sock)
        self.ready[container_id] = sock
        log.info("sandbox %s: executor generation %s, Python %s", container_id, hello.get("generation"),
                 hello.get("python"))
        return wire.relay_address(self.settings.process.http_host, self.port, container_id, self.relay.key(container_id))

    def forget(self, container_id: str) -> None:
        self.ready.pop(container_id, None)
        shutil.rmtree(self.root / container_id, ignore_errors=True)


# ---- the install container (pure but run_job and read_tail) -------------------------------------

def cache_name(workspace: str) -> str:
    """A workspace as one path component (names are checked at the gateway; this never trusts that)."""
    if workspace and workspace.replace("-", "").replace("_", "").isalnum() and len(workspace) <= 64:
        return workspace
    return "h-" + hashlib.sha256(workspace.encode()).hexdigest()[:16]


def image_key(image: ImageRef | None) -> str:
    """One directory per image a sandbox runs (its Python and libraries decide what pip installs)."""
    if image is None:
        return "base"
    return "i-" + hashlib.sha256(f"{image.image_id}\0{image.digest}".encode()).hexdigest()[:16]


def install_id(container_id: str) -> str:
    return f"{container_id[:100]}-install"


def install_spec(cspec: ContainerSpec, requirements: list[str], proxy: str,
                 pip: tuple[list[Mount], list[str]]) -> JobSpec:
    """The install container of a sandbox: its image, code (a `file:///app/...` requirement) and
    cache bind; the host's pip configuration read-only (as builds get it); the proxy variables."""
    mounts, pip_vars = pip
    env = {**dict(v.split("=", 1) for v in pip_vars), **proxy_env(proxy), "PYTHONUNBUFFERED": "1"}
    return JobSpec(container_id=install_id(cspec.container_id), code_dir=cspec.code_dir, sdk_dir=cspec.sdk_dir,
                   env=env, cpu_millicores=cspec.cpu_millicores, memory_mib=max(cspec.memory_mib, INSTALL_MEMORY_MIB),
                   command=("python3", "-m", "levers9.executor.install", "--", *requirements), port=0,
                   image=cspec.image, packages_dir=cspec.packages_dir,
                   binds=tuple(Bind(m.source, m.target, read_only=True) for m in mounts), egress_proxy=proxy)


async def run_job(runtime: RuncRuntime, job: JobSpec, timeout: float) -> tuple[Exit, str]:
    """Start the job's container, wait for its end (killed after `timeout`), remove it; its Exit
    and the last lines it printed."""
    await runtime.start(job)
    cid = job.container_id
    try:
        deadline = time.monotonic() + timeout
        while (ended := await runtime.poll(cid)) is None and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        tail = read_tail(runtime.container_dir(cid) / "upper", LOG_FILE)
    finally:
        await runtime.stop(cid, timeout=5)
    if ended is None:
        return Exit(None, f"timed out after {timeout:.0f} s"), tail
    return ended, tail


def read_tail(root: Path, relative: str, limit: int = TAIL_BYTES, lines: int = 12) -> str:
    """The last lines of a file that tenant code wrote under `root` (a container's upper layer),
    opened component by component without following a symlink, so a link planted in the container
    never makes this process read a host file. "" when it is not a plain file there."""
    fds: list[int] = []
    try:
        fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        parts = [p for p in relative.strip("/").split("/") if p]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (0 if last else os.O_DIRECTORY)
            fds.append(os.open(part, flags | os.O_NONBLOCK, dir_fd=fds[-1]))
        info = os.fstat(fds[-1])
        if not stat.S_ISREG(info.st_mode):
            return ""
        os.lseek(fds[-1], max(0, info.st_size - limit), os.SEEK_SET)
        text = os.read(fds[-1], limit).decode(errors="replace")
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            log.warning("could not read a container's file: %s", exc.strerror)
        return ""
    finally:
        for fd in fds:
            os.close(fd)
    return " | ".join(text.strip().splitlines()[-lines:])[-1500:]
