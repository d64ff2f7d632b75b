"""The checkpoint policy: when a container restores, when it starts cold and why, when one is dumped.

One policy, pure, used by three services: the gateway picks the checkpoint a new container should
restore (`restore_choice`), the scheduler falls back to a cold start when no worker can restore it
(`cold_fallback_note`), the worker decides whether to dump a ready container (`dump_choice`).
The rules, in order:
1. checkpoints are opt-in per deployment (`checkpoint_enabled`);
2. a checkpoint holds at most one GPU (CRIU's CUDA plugin dumps one device): more GPUs start cold;
3. only an `available` checkpoint (stored in S3) of the same deployment version is restored,
   the newest first;
4. a dump is taken once per deployment version, by a worker whose runtime has working CRIU, of a
   container that started cold (a restored container is already that checkpoint) — unless a user
   asked for this one (`manual`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .spec import CheckpointRef, DeploymentSpec

MAX_CHECKPOINT_GPUS = 1


@dataclass(frozen=True)
class RestoreChoice:
    checkpoint: CheckpointRef | None
    note: str  # why it starts cold ("" when it restores)


@dataclass(frozen=True)
class DumpChoice:
    dump: bool
    why: str


def gpu_rule(spec: DeploymentSpec) -> str:
    """Why this spec cannot be checkpointed because of its GPUs, or ""."""
    gpus = spec.resources.gpus
    if gpus > MAX_CHECKPOINT_GPUS:
        return f"{gpus} GPUs (a checkpoint holds at most {MAX_CHECKPOINT_GPUS})"
    return ""


def restore_choice(spec: DeploymentSpec, available: Sequence[CheckpointRef]) -> RestoreChoice:
    """`available`: this deployment version's stored checkpoints, newest first."""
    if not spec.checkpoint_enabled:
        return RestoreChoice(None, "cold: checkpoint_enabled is off")
    too_many = gpu_rule(spec)
    if too_many:
        return RestoreChoice(None, f"cold: {too_many}")
    if not available:
        return RestoreChoice(None, "cold: no checkpoint of this version yet (this start takes one)")
    return RestoreChoice(available[0], "")


def cold_fallback_note(checkpoint: CheckpointRef, why_not: str) -> str:
    """The scheduler's note when no worker can restore `checkpoint` and the container starts cold."""
    return f"cold: no worker can restore its checkpoint {checkpoint.checkpoint_id} ({why_not})"


def restore_note(checkpoint: CheckpointRef) -> str:
    return f"restore {checkpoint.checkpoint_id}"


def dump_choice(spec: DeploymentSpec | None, *, criu_ready: bool, restored: bool, manual: bool = False,
                version_has_checkpoint: bool = False, claimed_elsewhere: bool = False) -> DumpChoice:
    """Whether a ready container should be dumped now."""
    if spec is None:
        return DumpChoice(False, "the container runs no deployment")
    if not criu_ready:
        return DumpChoice(False, "CRIU is not ready on this worker")
    too_many = gpu_rule(spec)
    if too_many:
        return DumpChoice(False, too_many)
    if manual:
        return DumpChoice(True, "asked for by a user")
    if not spec.checkpoint_enabled:
        return DumpChoice(False, "checkpoint_enabled is off")
    if restored:
        return DumpChoice(False, "restored from a checkpoint already")
    if version_has_checkpoint:
        return DumpChoice(False, "this deployment version has a checkpoint")
    if claimed_elsewhere:
        return DumpChoice(False, "another worker is dumping this version")
    return DumpChoice(True, "first cold start of this version")
