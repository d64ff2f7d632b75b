"""Events of deployments: a deployed app, its versions and the right to dump one of them.

Subjects are `levers9.<workspace>.deployment.<deployment_id>.<EventType>`.
"""

from __future__ import annotations

from ..spec import DeploymentSpec
from .base import Event


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


class DeploymentScaled(Event, frozen=True, kw_only=True):
    """Its scaling changed at run time (`levers9 deployments scale`): each field given replaces the
    spec's (None: unchanged). The autoscaler applies it on its next pass (within a second)."""
    AGGREGATE = "deployment"
    ID_FIELD = "deployment_id"
    deployment_id: str
    min_containers: int | None = None
    max_containers: int | None = None
    buffer_containers: int | None = None
    target_concurrency: int | None = None
