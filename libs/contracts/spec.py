"""What a deployment asks for: one typed spec, from the SDK's JSON to the worker's container start.

The SDK (stdlib only, it runs inside containers) emits plain JSON of this shape; the gateway decodes
it with `decode_spec`, which validates every field and answers with a sentence naming the field;
DeploymentCreated, ContainerRequested and ContainerScheduled carry it; the worker starts from it.
Defaults are written here and nowhere else. One unit per quantity: millicores, MiB, seconds.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from .task_spec import ScheduleOptions, TaskQueueOptions
from .volumes import BucketMount, VolumeMount, check_mounts
from .warm_schedule import check as check_schedule

Name = Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]  # URL path, subject token, DNS label
PoolName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")]
Identifier = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
OptionalIdentifier = Annotated[str, Meta(pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")]
ModuleName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$", max_length=200)]
EnvName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
GpuType = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")]

MAX_CPU_MILLICORES = 256_000
MIN_MEMORY_MIB = 16
MAX_MEMORY_MIB = 4 * 1024 * 1024
MAX_GPUS = 8  # cards of one node for one container (a worker never splits a container over nodes)


class Resources(msgspec.Struct, frozen=True, kw_only=True):
    cpu_millicores: Annotated[int, Meta(gt=0, le=MAX_CPU_MILLICORES)] = 1000
    memory_mib: Annotated[int, Meta(ge=MIN_MEMORY_MIB, le=MAX_MEMORY_MIB)] = 1024
    gpu: list[GpuType] = []  # acceptable GPU types in order of preference; empty: any type or none
    gpu_count: Annotated[int, Meta(ge=0, le=MAX_GPUS)] = 0

    @property
    def gpus(self) -> int:
        """The GPUs a container takes: naming a type means at least one."""
        return max(1, self.gpu_count) if self.gpu else self.gpu_count


class Scaling(msgspec.Struct, frozen=True, kw_only=True):
    """How many containers a deployment has: the autoscaling policy (levers9.contracts.autoscaling)
    reads every field here. `keep_warm_seconds` is the older name of `scaledown_window` (how long a
    container may stay idle before the policy stops it): give one of them."""
    keep_warm_seconds: Annotated[int, Meta(ge=0, le=86_400)] = 60
    min_containers: Annotated[int, Meta(ge=0, le=100)] = 0
    max_containers: Annotated[int, Meta(ge=1, le=1000)] = 1
    concurrency: Annotated[int, Meta(ge=1, le=10_000)] = 1  # requests one container serves at once (hard cap)
    # calls of one deployment that may wait for a container at once (per gateway): one more gets 429
    max_pending: Annotated[int, Meta(ge=0, le=100_000)] = 1000
    buffer_containers: Annotated[int, Meta(ge=0, le=100)] = 0  # idle ones kept beyond the current load
    target_concurrency: Annotated[int, Meta(ge=0, le=10_000)] = 0  # calls per container aimed at; 0: concurrency
    scaledown_window: Annotated[int, Meta(ge=0, le=86_400)] | None = None  # None: keep_warm_seconds
    warm_schedule: dict[str, Annotated[int, Meta(ge=0, le=100)]] = {}  # cron expression -> minimum from its tick
    warm_schedule_timezone: str = "UTC"

    def __post_init__(self) -> None:
        if self.max_containers < self.min_containers:
            raise ValueError(f"max_containers={self.max_containers} is below min_containers={self.min_containers}")
        if self.target_concurrency > self.concurrency:
            raise ValueError(f"target_concurrency={self.target_concurrency} is above concurrency={self.concurrency} "
                             "(the hard cap of calls one container serves)")
        if self.buffer_containers > self.max_containers:
            raise ValueError(f"buffer_containers={self.buffer_containers} is above "
                             f"max_containers={self.max_containers}")
        if self.scaledown_window is not None and self.keep_warm_seconds not in (60, self.scaledown_window):
            raise ValueError(f"scaledown_window={self.scaledown_window} and keep_warm_seconds="
                             f"{self.keep_warm_seconds} disagree: give one of them (the same setting)")
        for expr, minimum in self.warm_schedule.items():
            if minimum > self.max_containers:
                raise ValueError(f"warm_schedule: {expr!r} asks for {minimum} containers, above "
                                 f"max_containers={self.max_containers}")
        check_schedule(self.warm_schedule, self.warm_schedule_timezone)

    @property
    def window(self) -> int:
        """Seconds a container may stay idle before it is stopped (scaledown_window, or its older name)."""
        return self.keep_warm_seconds if self.scaledown_window is None else self.scaledown_window

    @property
    def target(self) -> int:
        """Calls per container the policy aims for."""
        return self.target_concurrency or self.concurrency


class Code(msgspec.Struct, frozen=True, kw_only=True):
    """The user's code: a module of the uploaded archive and the function (or ASGI app) in it. A
    function sandbox for ad-hoc calls (kind "function", no archive) names no module: each call
    brings its function pickled."""
    kind: Literal["endpoint", "asgi", "realtime", "function", "box"] = "endpoint"  # realtime: a handler per WebSocket message
    module: OptionalIdentifier
    handler: OptionalIdentifier
    on_start: OptionalIdentifier = ""
    sha256: str = ""  # the archive (tar.gz) in the workspace's bucket; filled in by the gateway
    key: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("function", "box") and not (self.module and self.handler):
            raise ValueError(f"a {self.kind} needs its module and handler")
        if self.kind == "function" and self.key and not (self.module and self.handler):
            raise ValueError("a deployed function needs its module and handler")


# a pip requirement (`name`, `name==1.2`, `name[extra]>=2; python_version>"3"`) or a URL; never an
# option (each is one argument of `pip install`, so none may start with '-')
PythonPackage = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][^\n\r\x00]*$", max_length=400)]
AptPackage = Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9+.-]*(=[A-Za-z0-9.+:~-]+)?$", max_length=200)]
Command = Annotated[str, Meta(pattern=r"^[^\x00]*\S[^\x00]*$", max_length=8192)]
# a registry reference: [host[:port]/]path[:tag][@sha256:digest]
ImageReference = Annotated[str, Meta(pattern=r"^([a-z0-9][a-z0-9._/:@-]*)?$", max_length=256)]


class ImageSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A blueprint: the base, then apt packages, python packages, each command, the environment.
    Its id is a content hash (levers9.contracts.images.image_id); `base_image` "" is the platform's
    base (Debian bookworm with python3, pip and venv)."""
    base_image: ImageReference = ""
    apt_packages: list[AptPackage] = []
    python_packages: list[PythonPackage] = []
    commands: list[Command] = []
    env: dict[EnvName, str] = {}


class ArchiveRef(msgspec.Struct, frozen=True, kw_only=True):
    """A built image's flattened root in S3: one content-addressed archive and its file index."""
    bucket: str
    key: str  # the archive: every regular file's bytes once, packed; fetched by range in chunks
    sha256: str
    size_bytes: int
    index_key: str  # levers9.contracts.image_index.ImageIndex, msgpack, gzip
    index_sha256: str
    index_size: int = 0
    chunk_size: int = 4 << 20
    files: int = 0


class ImageRef(msgspec.Struct, frozen=True, kw_only=True):
    """A built image as a container start needs it; filled in by the gateway at deploy."""
    image_id: str
    reference: str = ""  # where it is in the registry (repository:tag)
    digest: str = ""
    archive: ArchiveRef | None = None


class FunctionOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What a Python function's sandbox adds to a deployment: retries, extra packages, and the
    executor protocol generation it speaks (levers9.executor.wire.GENERATION)."""
    retries: Annotated[int, Meta(ge=0, le=10)] = 0
    packages: list[PythonPackage] = []  # pip-installed per sandbox when the image lacks them
    generator: bool = False
    executor_generation: Annotated[int, Meta(ge=1)] = 1
    shared_checkpoints: bool = True  # False: never start from the platform's shared pre-import checkpoints
    preload: list[ModuleName] = []  # imported when the sandbox starts, before it is ready (a checkpoint holds them)


# one argument of a box's command (argv, no shell): any text but NUL
BoxArgument = Annotated[str, Meta(pattern=r"^[^\x00]*$", max_length=8192)]
# the path a box's readiness probe GETs: absolute, printable ASCII without spaces (a query may follow)
ReadyPath = Annotated[str, Meta(pattern=r"^/[!-~]*$", max_length=2048)]
MAX_BOX_ARGUMENTS = 256


class BoxOptions(msgspec.Struct, frozen=True, kw_only=True):
    """A box (code.kind "box"): any program that listens on a port. The worker runs `command` as the
    container's process instead of the runner, and the container is ready once `port` answers: a TCP
    connect, or a GET of `ready_path` answering 2xx. The gateway reaches it at /box/NAME/..."""
    command: Annotated[list[BoxArgument], Meta(min_length=1, max_length=MAX_BOX_ARGUMENTS)]
    port: Annotated[int, Meta(ge=1, le=65535)]
    ready_path: ReadyPath | None = None
    # dumped when it is stopped for being idle (or drained), and the next start restores that dump:
    # its processes' memory comes back as they left it (a notebook's kernels keep their variables)
    idle_checkpoint: bool = False

    def __post_init__(self) -> None:
        if not self.command[0].strip():
            raise ValueError("command: its first argument (the program) is empty")


# a sandbox's workdir: an absolute path without NUL, '..' or '//' (the root of its files API)
SandboxDir = Annotated[str, Meta(pattern=r"^(/[^\x00/]+)*/?$", min_length=1, max_length=1024)]


class SandboxOptions(msgspec.Struct, frozen=True, kw_only=True):
    """A sandbox (code.kind "function" with no module: its executor is the sandbox's agent, which
    runs exec and file requests inside the container). `workdir` is where programs start and the
    root of its files API; the container ends `timeout_seconds` after it was created (its lifetime;
    the idle timeout is scaling.keep_warm_seconds, the worker's keep-warm rule)."""
    workdir: SandboxDir = "/sandbox"
    timeout_seconds: Annotated[int, Meta(ge=1, le=7 * 86_400)] = 3600

    def __post_init__(self) -> None:
        if "/../" in self.workdir + "/" or "/./" in self.workdir + "/":
            raise ValueError(f"workdir {self.workdir!r}: give it without '.' or '..' components")


class DeploymentSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: Name
    app_name: str = ""
    code: Code
    image: ImageSpec | None = None
    image_ref: ImageRef | None = None  # the built image; the gateway fills it in, the SDK never sends it
    resources: Resources = Resources()
    scaling: Scaling = Scaling()
    timeout_seconds: Annotated[int, Meta(ge=1, le=86_400)] = 180
    secrets: list[EnvName] = []
    env: dict[EnvName, str] = {}
    checkpoint_enabled: bool = False
    pool: PoolName = "default"
    function: FunctionOptions | None = None  # code.kind "function" only
    volumes: list[VolumeMount] = []  # the workspace's volumes (levers9.contracts.volumes)
    buckets: list[BucketMount] = []  # S3 buckets mounted per container
    task_queue: TaskQueueOptions | None = None  # code.kind "function" only: its calls are tasks (task_spec.py)
    schedule: ScheduleOptions | None = None  # code.kind "function" only: run on a cron
    box: BoxOptions | None = None  # code.kind "box" only, and always there: its command and port
    sandbox: SandboxOptions | None = None  # a sandbox's deployment (code.kind "function", no module) only

    def __post_init__(self) -> None:
        check_mounts(self.volumes, self.buckets)
        if (self.box is None) != (self.code.kind != "box"):
            raise ValueError("box: a box (code.kind 'box') needs its command and port, and only a box has them")
        if (self.task_queue or self.schedule) and self.code.kind != "function":
            raise ValueError("task_queue and schedule are options of a deployed function (code.kind 'function')")
        if self.sandbox and (self.code.kind != "function" or self.code.module):
            raise ValueError("sandbox: only a sandbox's deployment (code.kind 'function', no module) has it")
        if self.box and self.box.idle_checkpoint and not self.checkpoint_enabled:
            raise ValueError("box.idle_checkpoint: a box dumped when idle restores that dump only with "
                             "checkpoint_enabled=True")



class CheckpointRef(msgspec.Struct, frozen=True, kw_only=True):
    """A checkpoint a container restores from: enough to fetch and check it without asking anyone."""
    checkpoint_id: str
    accelerator: str = ""  # the GPU type it was dumped on; a restore needs the same ("" = none)
    sha256: str = ""
    size_bytes: int = 0
    bucket: str = ""
    key: str = ""
    location: str = ""  # the node cache URL of the worker that dumped it


class InvalidSpec(ValueError):
    """A spec that does not decode; the message names the field and what is wrong with it."""


_decoder = msgspec.json.Decoder(DeploymentSpec)


def decode_spec(data: bytes | str) -> DeploymentSpec:
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise InvalidSpec(f"the deployment spec is not valid: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidSpec(f"the deployment spec is not JSON: {exc}") from None


def encode_spec(spec: DeploymentSpec) -> bytes:
    return msgspec.json.encode(spec)


def spec_from_builtins(data: dict) -> DeploymentSpec:
    """A spec from a decoded JSON object (a projection's jsonb column). A row projected before the
    typed spec holds the whole flat DeploymentCreated v1 body: it is upcast first, so a stack
    upgraded in place keeps serving its deployments without a projection rebuild."""
    if "code" not in data:
        from .upcasting import upcast  # upcasting knows nothing of this module: no cycle

        data = upcast("DeploymentCreated", 1, 2, dict(data))["spec"]
    return msgspec.convert(data, DeploymentSpec)
