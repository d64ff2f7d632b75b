"""Every event of levers9, one module per aggregate, joined here into one tagged union.

`from levers9.contracts.events import ContainerRequested` (or `events as E; E.ContainerRequested`)
works for every event: this package re-exports them all. `AnyEvent` is the union a message's body is
decoded into; `EVENT_TYPES` maps each type name (the class name, the envelope's `type`) to its class.
A new event goes into its aggregate's module and into `AnyEvent` below, in one commit.
"""

from __future__ import annotations

from typing import Union

from .base import Event
from .catalogue import CatalogueBuilt
from .checkpoint import CheckpointDeleted, CheckpointDumped, CheckpointFailed, CheckpointStored
from .cluster import ClusterAttached, ClusterDetached, ClusterShared, cluster_ref
from .container import (
    ContainerCheckpointRequested,
    ContainerFailed,
    ContainerReady,
    ContainerRequested,
    ContainerScheduled,
    ContainerStarted,
    ContainerStopped,
    ContainerStopRequested,
    PlacementDeferred,
)
from .deployment import (
    DeploymentCheckpointClaimed,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentScaled,
    DeploymentStopped,
)
from .function import FunctionCallFinished, FunctionCallStarted
from .image import (
    ImageBuildFailed,
    ImageBuildProgress,
    ImageBuildRequested,
    ImageBuildStarted,
    ImageBuilt,
    ImageDeleted,
    ImagePushed,
)
from .sandbox import SandboxCreated, SandboxSnapshotted, SandboxTerminated
from .schedule import ScheduleFired
from .secret import SecretDeleted, SecretSet
from .task import (
    TaskCancelled,
    TaskEnqueued,
    TaskExpired,
    TaskFailed,
    TaskRetried,
    TaskStarted,
    TaskSucceeded,
)
from .token import TokenCreated, TokenRevoked
from .volume import VolumeCreated, VolumeDeleted
from .worker import (
    WorkerCatalogueChecked,
    WorkerCordoned,
    WorkerDrained,
    WorkerFenced,
    WorkerLost,
    WorkerProvisioned,
    WorkerReady,
    WorkerRegistered,
    WorkerSlotReleased,
    WorkerSlotReserved,
    WorkerUncordoned,
)

AnyEvent = Union[
    DeploymentCreated, DeploymentStopped, DeploymentDeleted, DeploymentCheckpointClaimed, DeploymentScaled,
    ContainerRequested, ContainerScheduled, PlacementDeferred, ContainerStarted, ContainerReady,
    ContainerStopRequested, ContainerStopped, ContainerFailed, ContainerCheckpointRequested,
    WorkerProvisioned, WorkerRegistered, WorkerReady, WorkerLost, WorkerFenced, WorkerDrained, WorkerCordoned,
    WorkerUncordoned, WorkerSlotReserved, WorkerSlotReleased, CheckpointDumped, CheckpointStored, CheckpointFailed,
    CheckpointDeleted, ImageBuildRequested, ImageBuildStarted, ImageBuildProgress, ImagePushed, ImageBuilt, ImageBuildFailed,
    ImageDeleted, TokenCreated, TokenRevoked, SecretSet, SecretDeleted,
    FunctionCallStarted, FunctionCallFinished, CatalogueBuilt, WorkerCatalogueChecked,
    VolumeCreated, VolumeDeleted, ClusterAttached, ClusterShared, ClusterDetached,
    TaskEnqueued, TaskStarted, TaskSucceeded, TaskFailed, TaskRetried, TaskExpired, TaskCancelled, ScheduleFired,
    SandboxCreated, SandboxSnapshotted, SandboxTerminated,
]

EVENT_TYPES: dict[str, type[Event]] = {cls.__name__: cls for cls in AnyEvent.__args__}  # type: ignore[attr-defined]

__all__ = [
    "Event", "AnyEvent", "EVENT_TYPES", "cluster_ref",
    *EVENT_TYPES,
]
