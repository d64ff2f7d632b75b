"""Events of checkpoints: a worker dumped one, the checkpoint-store stored it (or it failed), it was deleted.

Subjects are `levers9.<workspace>.checkpoint.<checkpoint_id>.<EventType>`.
"""

from __future__ import annotations

from .base import Event


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
