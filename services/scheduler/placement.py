"""Placement: which worker runs a container. Pure; no I/O.

The order of the steps is the policy:
1. keep only workers that may take work at all: ready, not cordoned, in the requested pool, not
   excluded (a worker that lost this container before), with every runtime feature asked for;
2. GPU: try the acceptable GPU types in the caller's order of preference; a less preferred type is
   used only when no worker of a better type has the GPUs, cpu and memory free; a request with
   gpu_count and no type takes any GPU;
3. keep those with enough free cpu and memory;
4. rank best-fit: the fullest worker that still fits wins, so idle workers drain to zero and can be
   scaled down; ties go to the lowest worker id, so two schedulers agree.
When nothing fits, the reason names the step that emptied the list.

Before all of these (plan.py): a worker of an attached cluster is seen only by the work of the
workspaces its cluster admits, its owner and those it was shared with (`admitted`); every other
worker takes anyone's work.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

Access = Mapping[str, frozenset[str]]  # attached cluster -> the workspaces whose work may run there


@dataclass(frozen=True, slots=True)
class WorkerState:
    worker_id: str
    pool: str
    status: str  # ready | registered | lost | ...
    cpu_millicores: int
    memory_mib: int
    gpu_type: str = ""
    gpu_count: int = 0
    cpu_used: int = 0
    memory_used: int = 0
    gpu_used: int = 0
    features: frozenset[str] = frozenset()
    cordoned: bool = False
    last_seq: int = 0
    restorable: frozenset[str] = frozenset()  # shared checkpoints it announced it can restore
    cluster: str = ""  # the attached cluster it runs on (WorkerProvisioned, never the worker's own word)
    fence_awaited: bool = False  # lost, and what it left runs until WorkerFenced says it was stopped

    @property
    def cpu_free(self) -> int:
        return self.cpu_millicores - self.cpu_used

    @property
    def memory_free(self) -> int:
        return self.memory_mib - self.memory_used

    @property
    def gpu_free(self) -> int:
        return self.gpu_count - self.gpu_used


@dataclass(frozen=True)
class Request:
    container_id: str
    cpu_millicores: int
    memory_mib: int
    pool: str = "default"
    gpu: tuple[str, ...] = ()
    gpu_count: int = 0
    features: frozenset[str] = frozenset()
    excluded: frozenset[str] = frozenset()
    accelerator: str | None = None  # a restore must land on the accelerator it was dumped on ("" = none)


@dataclass(frozen=True)
class Placement:
    worker_id: str | None
    reason: str = ""
    candidates: tuple[str, ...] = field(default=())  # the best ranked: the winner, then the runner-up


def admitted(workspace: str, w: WorkerState, access: Access) -> bool:
    """May `workspace`'s work run on `w`? A cluster's worker: only its cluster's workspaces (an unknown
    or detached cluster admits nobody); any other worker: anyone."""
    return not w.cluster or workspace in access.get(w.cluster, frozenset())


def admitted_workers(workspace: str, workers: Sequence[WorkerState], access: Access) -> list[WorkerState]:
    return [w for w in workers if admitted(workspace, w, access)]


def not_admitted(workspace: str, pool: str, workers: Sequence[WorkerState], access: Access) -> str:
    """Why nothing of `pool` took the work when some of its workers are clusters `workspace` may not use."""
    names = sorted({w.cluster for w in workers if w.pool == pool and not admitted(workspace, w, access)})
    if not names:
        return ""
    return (f"cluster {', '.join(names)} (pool {pool!r}) is not shared with workspace {workspace!r}: its owner "
            f"can share it with `levers9 clusters share NAME --workspace {workspace}`")


def eligible(req: Request, w: WorkerState) -> bool:
    return (w.status == "ready" and not w.cordoned and w.pool == req.pool and w.worker_id not in req.excluded
            and req.features <= w.features and (req.accelerator is None or w.gpu_type == req.accelerator))


def gpu_groups(req: Request, workers: Sequence[WorkerState]) -> list[tuple[str, list[WorkerState]]]:
    """Candidates grouped by GPU type, best preferred first; one group of all when no GPU is asked."""
    if req.gpu_count <= 0 and not req.gpu:
        return [("", list(workers))]
    count = max(1, req.gpu_count)
    if not req.gpu:
        return [("any", [w for w in workers if w.gpu_type and w.gpu_free >= count])]
    return [(t, [w for w in workers if w.gpu_type == t and w.gpu_free >= count]) for t in req.gpu]


def score(req: Request, w: WorkerState) -> tuple[float, str]:
    """Lower is better: the share of the worker left free after placing, averaged over cpu and memory."""
    cpu_left = (w.cpu_free - req.cpu_millicores) / max(1, w.cpu_millicores)
    mem_left = (w.memory_free - req.memory_mib) / max(1, w.memory_mib)
    return ((cpu_left + mem_left) / 2, w.worker_id)


def place(req: Request, workers: Sequence[WorkerState]) -> Placement:
    pool_workers = [w for w in workers if w.pool == req.pool]
    usable = [w for w in pool_workers if eligible(req, w)]
    if not usable:
        return Placement(None, why_none_usable(req, pool_workers))
    groups = gpu_groups(req, usable)
    if not any(ws for _, ws in groups):
        count = max(1, req.gpu_count)
        kind = " or ".join(req.gpu) if req.gpu else "any type"
        return Placement(None, f"no worker has {count} free GPU(s) of {kind}")
    cpu, mem = req.cpu_millicores, req.memory_mib
    for _, group in groups:  # a less preferred GPU type only when no better one has room
        # score() inlined: this runs for every worker on every decision (thousands a second)
        ranked = heapq.nsmallest(2, [
            (((w.cpu_millicores - w.cpu_used - cpu) / max(1, w.cpu_millicores)
              + (w.memory_mib - w.memory_used - mem) / max(1, w.memory_mib)) / 2, w.worker_id)
            for w in group if w.cpu_millicores - w.cpu_used >= cpu and w.memory_mib - w.memory_used >= mem])
        if ranked:  # the winner and the runner-up
            return Placement(ranked[0][1], "", tuple(worker_id for _, worker_id in ranked))
    return Placement(None, f"no worker has {req.cpu_millicores}m cpu and {req.memory_mib} MiB free "
                           f"({len(usable)} ready in pool {req.pool!r})")


def why_none_usable(req: Request, pool_workers: Sequence[WorkerState]) -> str:
    """The step that left no worker at all: the pool, a runtime feature, the accelerator, readiness."""
    if not pool_workers:
        return f"no worker in pool {req.pool!r}"
    missing = sorted(req.features - frozenset().union(*(w.features for w in pool_workers)))
    if missing:
        return f"no worker in pool {req.pool!r} has {', '.join(missing)}"
    if req.accelerator is not None and not any(w.gpu_type == req.accelerator for w in pool_workers):
        return f"no worker in pool {req.pool!r} has accelerator {req.accelerator or 'none'!r}"
    return f"no ready, uncordoned worker in pool {req.pool!r}"


def gpus_taken(req: Request) -> int:
    """The GPUs a request takes: naming a type means at least one."""
    return max(1, req.gpu_count) if (req.gpu or req.gpu_count) else 0


def has_room(w: WorkerState, req: Request) -> bool:
    """Whether `req` still fits in what `w` has free (cpu, memory and the GPUs it takes)."""
    return (w.cpu_millicores - w.cpu_used >= req.cpu_millicores and w.memory_mib - w.memory_used >= req.memory_mib
            and w.gpu_count - w.gpu_used >= gpus_taken(req))


def reserve(w: WorkerState, req: Request, new_seq: int) -> WorkerState:
    """The worker after a successful reservation (what the projection will say once it catches up)."""
    return replace(w, cpu_used=w.cpu_used + req.cpu_millicores, memory_used=w.memory_used + req.memory_mib,
                   gpu_used=w.gpu_used + gpus_taken(req), last_seq=new_seq)
