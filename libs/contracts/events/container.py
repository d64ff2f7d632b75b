"""Events of containers: requested, placed, started, ready, stopped or failed, and a manual dump.

Subjects are `levers9.<workspace>.container.<container_id>.<EventType>`. The request carries
everything the scheduler needs and the placement everything the worker needs (one typed request
flows end to end).
"""

from __future__ import annotations

from typing import Any

from ..spec import CheckpointRef, DeploymentSpec, Resources
from .base import Event


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
    # the function session (`app.session()`) this sandbox is for alone, "" for none: it carries its
    # deployment's id but is one caller's own, so the autoscaler neither counts nor stops it (the
    # gateway's session sweep does, the worker's keep-warm as the backstop). Optional with a default:
    # events from before it decode as no session
    session_id: str = ""

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
    # the request's session_id, copied: the worker keeps its keep-warm rule for a session's sandbox
    # of an autoscaled deployment (its backstop when the gateway that swept the session is gone).
    # Optional with a default: placements from before it decode as no session
    session_id: str = ""

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
    # when its root filesystem (its image, lazily mounted, or the base) was in place, ISO 8601 UTC;
    # "" where the runtime mounts none (the process runtime) or from workers before this field
    root_mounted_at: str = ""


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
    # dump it first, so that its deployment's next start restores it as it is now (the autoscaler
    # scaling in a box with idle_checkpoint, such as a notebook)
    checkpoint_first: bool = False


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


class ContainerCheckpointRequested(Event, frozen=True, kw_only=True):
    """A manual dump (`levers9 containers checkpoint ID`)."""
    AGGREGATE = "container"
    ID_FIELD = "container_id"
    container_id: str
