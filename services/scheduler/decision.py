"""The scheduler's decision for one typed request: where it runs, and whether it restores. Pure; no I/O.

A request that carries a checkpoint goes to a worker with CRIU and the checkpoint's accelerator; when
no worker can take it that way, it starts cold elsewhere rather than wait (the note says why, in the
words of the one checkpoint policy).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from levers9.contracts.catalogue import Catalogue
from levers9.contracts.checkpoint_policy import cold_fallback_note, restore_note
from levers9.contracts.events import ContainerRequested
from levers9.contracts.spec import CheckpointRef, ImageRef

from .placement import Placement, Request, WorkerState, place
from .shared import shared_placement


@dataclass(frozen=True)
class Decision:
    placement: Placement
    request: Request  # what was placed (the capacity a reservation takes)
    checkpoint: CheckpointRef | None  # restore this one; None: start cold
    note: str
    choice: dict[str, Any] = field(default_factory=dict)  # the cost model's estimate and runner-up (shared.py)
    image: ImageRef | None = None  # a shared checkpoint runs on the catalogue's image

    @property
    def worker_id(self) -> str | None:
        return self.placement.worker_id

    @property
    def reason(self) -> str:
        return self.placement.reason


def request_from(ev: ContainerRequested) -> Request:
    """The placement request of a ContainerRequested: its resources, pool and excluded workers."""
    res = ev.resources
    return Request(container_id=ev.container_id, cpu_millicores=res.cpu_millicores, memory_mib=res.memory_mib,
                   pool=ev.pool or "default", gpu=tuple(res.gpu), gpu_count=res.gpus,
                   excluded=frozenset(ev.excluded_workers))


def decide(ev: ContainerRequested, workers: Sequence[WorkerState],
           catalogues: Mapping[str, Catalogue] | None = None) -> Decision:
    """Where `ev` runs among `workers`, restoring its checkpoint when a worker can; a function's
    sandbox may start from a shared pre-import checkpoint, as the cost model picks (shared.py)."""
    req = request_from(ev)
    if catalogues:
        shared = shared_placement(ev, req, workers, catalogues)
        if shared is not None:
            placement, request, checkpoint, note, choice, image = shared
            return Decision(placement, request, checkpoint, note, choice, image)
    ref = ev.checkpoint
    if ref is None:
        return Decision(place(req, workers), req, None, ev.note)
    restorable = replace(req, features=req.features | {"criu"}, accelerator=ref.accelerator)
    restore = place(restorable, workers)
    if restore.worker_id is not None:
        return Decision(restore, restorable, ref, restore_note(ref))
    return Decision(place(req, workers), req, None, cold_fallback_note(ref, restore.reason))
