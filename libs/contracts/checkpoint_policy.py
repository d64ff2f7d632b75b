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


def idle_checkpoint(spec: DeploymentSpec | None) -> bool:
    """Whether a container of `spec` is dumped before it is scaled in or drained, and its next start
    restores that newest dump (a box with idle_checkpoint: a notebook's kernels keep their memory)."""
    return bool(spec is not None and spec.box is not None and spec.box.idle_checkpoint and spec.checkpoint_enabled)


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


# ---- restore failures: whose fault ---------------------------------------------------------------
# A failed restore always starts cold. Only a fault of the checkpoint itself (its archive is corrupt,
# gone, or CRIU/the unpack refuses its image) marks it failed for good: a node cache or S3 that does
# not answer, or a timeout, says nothing about the checkpoint, which stays available and is tried again
# by the next start. (Seen: a node cache down for a minute marked a checkpoint restored 14 times before
# `restore_failed` for good.)

NODE_CACHE = "node_cache"  # fetching the archive through this node's content cache
RUNTIME = "runtime"  # unpacking it and CRIU restoring it
# what the node cache says of a fill it could not do (its X-Levers9-Fault header)
CONTENT, MISSING, UNREACHABLE = "content", "missing", "unreachable"
TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RestoreFailure:
    """What went wrong, as plain values (the worker's shell fills it in from the exception)."""
    stage: str  # NODE_CACHE | RUNTIME
    answered: bool = True  # False: the node cache (or whatever the stage talks to) never answered
    timed_out: bool = False
    status: int = 0  # the node cache's HTTP status
    fault: str = ""  # the node cache's own word: CONTENT | MISSING | UNREACHABLE | "" (not said)
    transient_cause: bool = False  # runtime: the error was caused by a connection or a timeout


@dataclass(frozen=True)
class RestoreVerdict:
    its_own: bool  # True: the checkpoint is at fault (mark it failed); False: transient (keep it)
    why: str


def restore_failure_verdict(f: RestoreFailure) -> RestoreVerdict:
    """Whose fault a failed restore is, in order:
    1. nothing answered, or it timed out: transient;
    2. the node cache said why: the archive's content is wrong (hash, seal) or it is gone from S3 ->
       the checkpoint's own fault; its source (S3, a peer) is unreachable -> transient;
    3. the node cache did not say: a status that means "try again" (5xx, 408, 429) is transient,
       any other refusal (4xx) is the checkpoint's;
    4. the runtime refused it (unpack, manifest, root, CRIU): the checkpoint's own fault, unless a
       connection or a timeout caused that error (an image fetched lazily, a slow disk)."""
    if not f.answered or f.timed_out:
        return RestoreVerdict(False, "timed out" if f.timed_out else "no answer")
    if f.stage == NODE_CACHE:
        if f.fault in (CONTENT, MISSING):
            return RestoreVerdict(True, f"the node cache refused its archive ({f.fault})")
        if f.fault == UNREACHABLE:
            return RestoreVerdict(False, "the archive's source is unreachable")
        if f.status in TRANSIENT_STATUSES or f.status >= 500:
            return RestoreVerdict(False, f"the node cache answered {f.status}")
        return RestoreVerdict(True, f"the node cache refused it ({f.status})")
    if f.transient_cause:
        return RestoreVerdict(False, "caused by a connection or a timeout")
    return RestoreVerdict(True, "the runtime refused its image")
