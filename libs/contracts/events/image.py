"""Events of images: a build requested, given to a builder, its steps, pushed, built or failed, deleted.

Subjects are `levers9.<workspace>.image.<image_id>.<EventType>`; the image id is the blueprint's
hash, so two deploys of one blueprint share one image.
"""

from __future__ import annotations

from typing import Literal

from ..images import BuildStep
from ..spec import ArchiveRef, ImageSpec
from .base import Event


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
