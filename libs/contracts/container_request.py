"""The request for one more container of a deployment version: what the gateway appends for a
waiting call and the scheduler's autoscaler for the policy, built the same way by both (the
checkpoint to restore is the checkpoint policy's choice, levers9.contracts.checkpoint_policy)."""

from __future__ import annotations

from .checkpoint_policy import RestoreChoice
from .events import ContainerRequested
from .spec import DeploymentSpec


def container_request(spec: DeploymentSpec, deployment_id: str, version: int, choice: RestoreChoice,
                      container_id: str, reason: str) -> ContainerRequested:
    return ContainerRequested(
        container_id=container_id, deployment_id=deployment_id, deployment_version=version,
        resources=spec.resources, pool=spec.pool, spec=spec, checkpoint=choice.checkpoint, note=choice.note,
        reason=reason)
