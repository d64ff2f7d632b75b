"""Every event of levers9: small, frozen msgspec Structs in one tagged union.

Events are facts in the past tense. Each class names its aggregate and the field that holds the
aggregate's id; the subject is computed from those (subjects.py). `VERSION` is the schema version of
the body; bump it only with an upcaster in upcasting.py. Adding a field with a default needs no bump.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Union

import msgspec

from .images import BuildStep
from .spec import ArchiveRef, CheckpointRef, DeploymentSpec, ImageSpec, Resources


class Event(msgspec.Struct, frozen=True, kw_only=True, tag=True, tag_field="type"):
    AGGREGATE: ClassVar[str] = ""
    ID_FIELD: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    SYSTEM: ClassVar[bool] = False  # platform aggregate: lives in workspace `_sys`

    @property
    def aggregate_id(self) -> str:
        return getattr(self, self.ID_FIELD)

    @classmethod
    def type_name(cls) -> str:
        return cls.__name__


# ---- deployments -------------------------------------------------------------------------------

class DeploymentCreated(Event, frozen=True, kw_only=True):
    """Version 2: everything the deployment asks for is one typed `spec` (v1 had flat fields)."""
    AGGREGATE = "deployment"
    ID_FIELD = "deployment_id"
    VERSION = 2
    deployment_id: str
    name: str
    version: int = 1
    spec: DeploymentSpec


class DeploymentStopped(Event, frozen=True, kw_only=True):
    AGGREGATE = "deployment"
    ID_FIELD = "deployment_id"
    deployment_id: str
    reason: str = ""


class DeploymentDeleted(Event, frozen=True, kw_only=True):
    AGGREGATE = "deployment"
    ID_FIELD = "deployment_id"
    deployment_id: str


class DeploymentCheckpointClaimed(Event, frozen=True, kw_only=True):
    """A worker's right to dump this deployment version (optimistic concurrency: one dump at a time)."""
    AGGREGATE = "deployment"
    ID_FIELD = "deployment_id"
    deployment_id: str
    checkpoint_id: str
    worker_id: str
    container_id: str


# ---- containers --------------------------------------------------------------------------------

class ContainerRequested(Event, frozen=True, kw_only=True):
    """Version 3: `resources` (millicores, MiB, GPUs), the deployment's `spec` and the `checkpoint`
    to restore travel typed (v2 had flat resource fields, a checkpoint id and its accelerator)."""
    AGGREGATE = "container"
    ID_FIELD = "container_id"
    VERSION = 3
    container_id: str
    deployment_id: str = ""
    deployment_version: int = 0
    resources: Resources = Resources()
    pool: str = "default"
    spec: DeploymentSpec | None = None  # what to run; None for a bare container request
    checkpoint: CheckpointRef | None = None  # restore this one when a worker can
    reason: str = ""
    attempt: int = 1  # > 1 when re-requested after its worker was lost
    excluded_workers: list[str] = []
    note: str = ""  # why it starts cold, when it does (shown by `levers9 containers list`)
    imports: list[str] = []  # a function's top-level imports (the client's ast), for the checkpoint choice

    @property
    def checkpoint_id(self) -> str:
        return self.checkpoint.checkpoint_id if self.checkpoint else ""


class ContainerScheduled(Event, frozen=True, kw_only=True):
    """Version 2: carries what the worker needs to start the container (the spec, the resources
    reserved for it, the checkpoint to restore), so the worker reads nothing else to start it."""
    AGGREGATE = "container"
    ID_FIELD = "container_id"
    VERSION = 2
    container_id: str
    worker_id: str
    attempt: int = 1
    deployment_id: str = ""
    deployment_version: int = 0
    resources: Resources = Resources()
    spec: DeploymentSpec | None = None
    checkpoint: CheckpointRef | None = None  # restore this one; None: start cold
    note: str = ""
    choice: dict[str, Any] = {}  # a function sandbox's start, as the cost model chose it: estimate, runner-up

    @property
    def checkpoint_id(self) -> str:
        return self.checkpoint.checkpoint_id if self.checkpoint else ""


class PlacementDeferred(Event, frozen=True, kw_only=True):
    AGGREGATE = "container"
    ID_FIELD = "container_id"
    container_id: str
    reason: str


class ContainerStarted(Event, frozen=True, kw_only=True):
    AGGREGATE = "container"
    ID_FIELD = "container_id"
    container_id: str
    worker_id: str
    restored_from: str = ""  # checkpoint id, when restored
    note: str = ""  # "restored from …" or why it started cold


class ContainerReady(Event, frozen=True, kw_only=True):
    AGGREGATE = "container"
    ID_FIELD = "container_id"
    container_id: str
    worker_id: str
    address: str


class ContainerStopRequested(Event, frozen=True, kw_only=True):
    AGGREGATE = "container"
    ID_FIELD = "container_id"
    container_id: str
    reason: str = ""


class ContainerStopped(Event, frozen=True, kw_only=True):
    AGGREGATE = "container"
    ID_FIELD = "container_id"
    container_id: str
    worker_id: str
    exit_code: int = 0
    reason: str = ""


class ContainerFailed(Event, frozen=True, kw_only=True):
    AGGREGATE = "container"
    ID_FIELD = "container_id"
    container_id: str
    worker_id: str = ""
    exit_code: int | None = None
    reason: str


# ---- workers (platform) ------------------------------------------------------------------------

class WorkerProvisioned(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    pool: str = "default"
    backend: str = "local"
    cluster: str = ""  # backend "cluster": the attached cluster it runs on (only its workspaces' work goes there)


class WorkerRegistered(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    pool: str = "default"
    cpu_millicores: int
    memory_mib: int
    gpu_type: str = ""
    gpu_count: int = 0
    gpu_source: str = ""  # detected (NVML) | configured (the pool's gpu_type, gpus_per_worker) | "" (none)
    gpu_ids: list[str] = []  # the cards offered: uuids when detected, indices when configured
    gpu_driver: str = ""  # the NVIDIA driver version NVML reported
    features: list[str] = []  # runtime features, e.g. "runc", "criu"
    address: str = ""
    token_id: str = ""  # the worker token it was started with (scope worker:<id>)


class WorkerReady(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str


class WorkerLost(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    reason: str = ""
    awaits_fence: bool = False  # its containers are placed again only after WorkerFenced (events_fencing.py)


class WorkerDrained(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str


class WorkerCordoned(Event, frozen=True, kw_only=True):
    """No new placements; `drain` also stops its containers so they are placed elsewhere."""
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    drain: bool = False


class WorkerUncordoned(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str


class WorkerSlotReserved(Event, frozen=True, kw_only=True):
    """Capacity taken on a worker, with optimistic concurrency on its subject: one takes the last slot."""
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    container_id: str
    workspace: str
    cpu_millicores: int
    memory_mib: int
    gpu_count: int = 0


class WorkerSlotReleased(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    container_id: str
    reason: str = ""
    reserved_seq: int = 0  # the reservation released (its stream sequence); 0: whichever holds the slot


# ---- checkpoints -------------------------------------------------------------------------------

class CheckpointDumped(Event, frozen=True, kw_only=True):
    AGGREGATE = "checkpoint"
    ID_FIELD = "checkpoint_id"
    checkpoint_id: str
    deployment_id: str
    deployment_version: int = 1
    container_id: str = ""
    worker_id: str
    accelerator: str = ""
    runtime: str = "runc"
    size_bytes: int
    sha256: str
    location: str  # where the worker keeps it (node cache URL or path)
    image_id: str = ""  # the image its root was ("" the platform's base); a restore mounts that image


class CheckpointStored(Event, frozen=True, kw_only=True):
    AGGREGATE = "checkpoint"
    ID_FIELD = "checkpoint_id"
    checkpoint_id: str
    bucket: str
    key: str
    size_bytes: int
    sha256: str


class CheckpointFailed(Event, frozen=True, kw_only=True):
    AGGREGATE = "checkpoint"
    ID_FIELD = "checkpoint_id"
    checkpoint_id: str
    stage: str  # dump | upload | restore
    reason: str
    deployment_id: str = ""
    worker_id: str = ""


class CheckpointDeleted(Event, frozen=True, kw_only=True):
    AGGREGATE = "checkpoint"
    ID_FIELD = "checkpoint_id"
    checkpoint_id: str


class ContainerCheckpointRequested(Event, frozen=True, kw_only=True):
    """A manual dump (`levers9 containers checkpoint ID`)."""
    AGGREGATE = "container"
    ID_FIELD = "container_id"
    container_id: str


# ---- images ------------------------------------------------------------------------------------

class ImageBuildRequested(Event, frozen=True, kw_only=True):
    """Version 2: the whole blueprint (v1 had base, python_packages and commands flat). Appended by
    the gateway with expected version 0 on the image's subject (or the failed build's last sequence):
    two deploys of one blueprint at once request it once."""
    AGGREGATE = "image"
    ID_FIELD = "image_id"
    VERSION = 2
    image_id: str
    blueprint: ImageSpec
    requested_by: str = ""  # the deployment name or `images build`


class ImageBuildStarted(Event, frozen=True, kw_only=True):
    """Version 2: the image-builder gave the build to `builder`, a worker of the build pool, with the
    steps and how many of them the layer cache holds (the build starts from the last cached one)."""
    AGGREGATE = "image"
    ID_FIELD = "image_id"
    VERSION = 2
    image_id: str
    builder: str
    attempt: int = 1
    blueprint: ImageSpec
    steps: list[BuildStep]
    cached_steps: int = 0  # steps[:cached_steps] are reused from the cache


class ImageBuildProgress(Event, frozen=True, kw_only=True):
    """A step of a build began, was reused, finished or failed, or printed lines (batched)."""
    AGGREGATE = "image"
    ID_FIELD = "image_id"
    image_id: str
    builder: str = ""
    step: int  # BuildStep.index
    total: int
    state: Literal["cached", "running", "log", "done", "failed", "pushing"]
    lines: list[str] = []
    seconds: float = 0.0


class ImagePushed(Event, frozen=True, kw_only=True):
    """The builder pushed the image (and a cache tag per step) to the registry; the image-builder
    then writes its archive and index to S3 and appends ImageBuilt."""
    AGGREGATE = "image"
    ID_FIELD = "image_id"
    image_id: str
    builder: str
    registry: str  # host:port
    reference: str  # repository:tag in that registry
    digest: str
    step_hashes: list[str] = []  # the steps whose cache tags exist now


class ImageBuilt(Event, frozen=True, kw_only=True):
    """Version 2: the registry reference and the S3 archive (v1 had a digest and a location)."""
    AGGREGATE = "image"
    ID_FIELD = "image_id"
    VERSION = 2
    image_id: str
    digest: str
    reference: str = ""
    location: str  # the index in S3, s3://bucket/key
    size_bytes: int = 0  # the flattened root's bytes
    archive: ArchiveRef | None = None
    seconds: float = 0.0  # from ImageBuildStarted to this


class ImageBuildFailed(Event, frozen=True, kw_only=True):
    AGGREGATE = "image"
    ID_FIELD = "image_id"
    image_id: str
    reason: str
    step: int = -1  # the failing BuildStep.index; -1: not a step (scheduling, push, archive)
    log_tail: list[str] = []


class ImageDeleted(Event, frozen=True, kw_only=True):
    AGGREGATE = "image"
    ID_FIELD = "image_id"
    image_id: str


# ---- tokens ------------------------------------------------------------------------------------

class TokenCreated(Event, frozen=True, kw_only=True):
    """Only the sha256 of the secret is ever in the log."""
    AGGREGATE = "token"
    ID_FIELD = "token_id"
    token_id: str
    token_sha256: str
    name: str = ""
    scope: str = "workspace"  # workspace | worker:<worker_id> (valid for that worker alone)


class TokenRevoked(Event, frozen=True, kw_only=True):
    AGGREGATE = "token"
    ID_FIELD = "token_id"
    token_id: str


class SecretSet(Event, frozen=True, kw_only=True):
    """The value is sealed (levers9.runtime.sealing, AES-256-GCM); plaintext never enters the log."""
    AGGREGATE = "secret"
    ID_FIELD = "name"
    name: str
    ciphertext: str


class SecretDeleted(Event, frozen=True, kw_only=True):
    AGGREGATE = "secret"
    ID_FIELD = "name"
    name: str


# ---- shared pre-import checkpoints ---------------------------------------------------------------

class CatalogueBuilt(Event, frozen=True, kw_only=True):
    """A catalogue of shared pre-import checkpoints is in S3; a flavor's newest replaces the one before."""
    AGGREGATE = "catalogue"
    ID_FIELD = "catalogue_id"
    SYSTEM = True
    catalogue_id: str
    flavor: str = "cpu"
    image_id: str = ""
    bucket: str
    key: str
    sha256: str
    checkpoints: list[str] = []


class WorkerCatalogueChecked(Event, frozen=True, kw_only=True):
    """Which of a catalogue's checkpoints this worker can restore, and why it dropped the others
    (sandbox settings that differ from those they were captured with)."""
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    catalogue_id: str
    restorable: list[str] = []
    dropped: dict[str, str] = {}  # checkpoint id -> why


# ---- function calls ----------------------------------------------------------------------------

class FunctionCallStarted(Event, frozen=True, kw_only=True):
    """One attempt of a Python function call began in a sandbox. Never its arguments."""
    AGGREGATE = "call"
    ID_FIELD = "call_id"
    call_id: str
    deployment_id: str
    function: str  # app.name
    token_id: str = ""  # the caller's token
    attempt: int = 1
    container_id: str = ""
    mode: str = "call"  # call | spawn | rest
    session_id: str = ""


class FunctionCallFinished(Event, frozen=True, kw_only=True):
    """How one attempt ended. Never its result: `outcome` is ok | error | timeout | cancelled |
    failed (a platform failure: the sandbox died, no capacity), with the exception's type or the reason."""
    AGGREGATE = "call"
    ID_FIELD = "call_id"
    call_id: str
    deployment_id: str
    function: str
    attempt: int = 1
    outcome: str
    duration_ms: float = 0.0
    error_type: str = ""
    reason: str = ""
    retrying: bool = False


from .events_clusters import ClusterAttached, ClusterDetached, ClusterShared  # noqa: E402 - they subclass Event
from .events_fencing import WorkerFenced  # noqa: E402 - it subclasses Event
from .events_volumes import VolumeCreated, VolumeDeleted  # noqa: E402 - they subclass Event

AnyEvent = Union[
    DeploymentCreated, DeploymentStopped, DeploymentDeleted, DeploymentCheckpointClaimed,
    ContainerRequested, ContainerScheduled, PlacementDeferred, ContainerStarted, ContainerReady,
    ContainerStopRequested, ContainerStopped, ContainerFailed, ContainerCheckpointRequested,
    WorkerProvisioned, WorkerRegistered, WorkerReady, WorkerLost, WorkerFenced, WorkerDrained, WorkerCordoned,
    WorkerUncordoned, WorkerSlotReserved, WorkerSlotReleased, CheckpointDumped, CheckpointStored, CheckpointFailed,
    CheckpointDeleted, ImageBuildRequested, ImageBuildStarted, ImageBuildProgress, ImagePushed, ImageBuilt, ImageBuildFailed,
    ImageDeleted, TokenCreated, TokenRevoked, SecretSet, SecretDeleted,
    FunctionCallStarted, FunctionCallFinished, CatalogueBuilt, WorkerCatalogueChecked,
    VolumeCreated, VolumeDeleted, ClusterAttached, ClusterShared, ClusterDetached,
]

EVENT_TYPES: dict[str, type[Event]] = {cls.__name__: cls for cls in AnyEvent.__args__}  # type: ignore[attr-defined]
