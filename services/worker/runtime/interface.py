"""What every container runtime of the worker shares: the interface and the plain values it speaks.

`ContainerSpec` (what to run), `Started` (where it answers), `Exit` (how it ended, with a sentence),
`Capabilities` (what a runtime can do, in one value: callers read it instead of probing the object),
and `Runtime`, the interface the worker drives. The implementations live in their own modules
(levers9.worker.runtime.process, levers9.worker.runtime.runc.runc_runtime); levers9.worker.runtime.choice
picks one. Nothing here imports an implementation, so no module cycle runs through this one.
"""

from __future__ import annotations

import re
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from levers9.contracts.spec import ImageRef
from levers9.contracts.volumes import Bind
from levers9.runtime.config import Settings
from levers9.worker.checkpoints.archive import CheckpointArtifact
from levers9.worker.checkpoints.criu_install import CriuInfo
from levers9.worker.gpus.cards import GpuGrant

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
    image: ImageRef | None = None  # its root's read-only layer (levers9.worker.images.layers); None: the platform base
    # a function sandbox: host dir -> /run/levers9 (the executor's socket), cloudpickle beside the
    # SDK -> /opt/levers9-vendor (read-only), the node's package installs -> /var/lib/levers9/packages
    executor_dir: Path | None = None
    vendor_dir: Path | None = None
    packages_dir: Path | None = None
    workspace: str = ""  # whose container it is, and of which deployment: its peer group (firewall)
    deployment_id: str = ""
    binds: tuple[Bind, ...] = ()  # volumes and buckets (levers9.worker.mounts.volumes): host dir -> container path
    gpu: GpuGrant | None = None  # its cards (levers9.worker.gpus.cards): NVIDIA_VISIBLE_DEVICES and CDI edits

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
    root_mounted_at: float = 0.0  # wall clock when its root filesystem (its image) was mounted; 0: none


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


@dataclass(frozen=True)
class Capabilities:
    """What a runtime can do (beta9's Runtime.Capabilities()): fixed for its kind, read by the worker
    instead of asking the runtime object what it has. Whether checkpoints work *now* (CRIU found and
    armed) is state, not a capability: `Runtime.checkpoint_ready`."""
    isolation: bool = False  # own root, network namespace, seccomp, no privileges: tenant code is confined
    memory_limit: bool = False  # a container that outgrows `memory_mib` is killed (Exit.oom)
    checkpoints: bool = False  # checkpoint() and restore() once CRIU is armed (enable_checkpoints)
    warm_checkpoints: bool = False  # warm(): a checkpoint unpacked ahead of its first restore
    confined_jobs: bool = False  # one-off job containers (a function's package install) confined alike


class Runtime(ABC):
    name: str
    features: list[str]  # what the worker's registration advertises (the scheduler matches on them)
    capabilities: Capabilities = Capabilities()

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

    def open_log(self, container_id: str) -> BinaryIO:
        """The log, opened for reading (OSError when there is none). A runtime whose containers write
        their log where the host reads it opens it without following their links."""
        return open(self.log_path(container_id), "rb")

    def log_tail(self, container_id: str, lines: int = 12) -> str:
        """The log's last lines, joined (for a failure's reason); empty when there is none."""
        try:
            with self.open_log(container_id) as f:
                text = f.read().decode(errors="replace").strip().splitlines()
        except OSError:  # none, or a link the container planted
            return ""
        return " | ".join(text[-lines:])[-1500:]

    @abstractmethod
    async def cleanup_all(self) -> list[str]:
        """Remove what a previous run of this worker (same state_dir) left; their ids."""

    @abstractmethod
    def running(self) -> list[str]:
        """Ids started by this runtime object and not stopped yet."""

    async def close(self) -> None:
        """Let go of what outlives containers (the runc runtime's image mounts) when the worker stops."""
        return None

    @property
    def enforces_memory_limit(self) -> bool:
        """Whether a container that outgrows `memory_mib` is killed (Exit.oom)."""
        return self.capabilities.memory_limit

    # -- checkpoint/restore: only where `capabilities.checkpoints` (the runc runtime with CRIU) --

    @property
    def checkpoint_ready(self) -> bool:
        """Whether checkpoint() and restore() can work here now."""
        return False

    def memory_usage(self, container_id: str) -> int | None:
        """Bytes the container holds now (roughly what a dump writes), None if unknown."""
        return None

    async def checkpoint(self, container_id: str, out_tar: Path, *, cut_connections: bool = False
                         ) -> CheckpointArtifact:
        """Dump the running container into one tar, leaving it running (CheckpointError).
        `cut_connections`: end its TCP connections to anything but itself first (callers' idle
        keep-alives: a dump taken to stop it must not fail on them)."""
        raise NotImplementedError(f"the {self.name} runtime cannot checkpoint")

    async def restore(self, spec: ContainerSpec, tar: Path) -> Started:
        """Start `spec.container_id` from a checkpoint tar instead of booting (RestoreError)."""
        raise NotImplementedError(f"the {self.name} runtime cannot restore a checkpoint")

    async def enable_checkpoints(self, progress: Progress = lambda s: None) -> CriuInfo:
        """Find or make CRIU and arm checkpoint() and restore() with it (CriuUnavailable says why not)."""
        raise NotImplementedError(f"the {self.name} runtime cannot checkpoint")

    async def warm(self, tar: Path) -> None:
        """Unpack a checkpoint ahead of its first restore (only where `capabilities.warm_checkpoints`)."""
        raise NotImplementedError(f"the {self.name} runtime keeps no unpacked checkpoints")


# ---- /proc (tells a reused pid apart) ------------------------------------------------------------

def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def proc_state(pid: int) -> str | None:
    """The one-letter state of a process (R, S, Z, ...), None when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
