"""Shared pre-import checkpoints in the scheduler's decision (pure): the router for function calls.

For a function's sandbox that may start from one (shared_checkpoints on, no image or env or secrets
of its own: a restored process keeps the environment it was captured with, and runs on the
catalogue's image), every worker with room is offered to `choose_checkpoint` with the candidates:
cold, each checkpoint of the flavor's catalogue that a worker announced it can restore, and the
deployment's own checkpoint. The lowest expected start wins; the decision carries the estimate and
the runner-up, which ContainerScheduled records (`levers9 events replay` shows why).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from levers9.contracts.catalogue import Catalogue, Flavor
from levers9.contracts.checkpoint_choice import (
    CallNeeds,
    Candidate,
    Choice,
    WorkerView,
    choose_checkpoint,
    distributions_for_imports,
    import_table,
    module_table,
    own_candidate,
    shared_candidates,
)
from levers9.contracts.events import ContainerRequested
from levers9.contracts.spec import CheckpointRef

from .placement import Placement, Request, WorkerState, eligible, has_room

FLAVOR: Flavor = "cpu"  # GPU sandboxes have no shared checkpoints yet


def may_share(ev: ContainerRequested) -> bool:
    spec = ev.spec
    return (spec is not None and spec.code.kind == "function" and spec.function is not None
            and spec.function.shared_checkpoints and spec.image is None and not spec.env and not spec.secrets
            and ev.resources.gpus == 0 and bool(ev.imports))


def call_needs(ev: ContainerRequested, catalogue: Catalogue) -> CallNeeds:
    own_seconds, depends_on = import_table(catalogue.packages)
    assert ev.spec is not None and ev.spec.function is not None
    return CallNeeds(distributions=distributions_for_imports(ev.imports, module_table(catalogue.packages)),
                     packages=list(ev.spec.function.packages), flavor=FLAVOR, import_seconds=own_seconds,
                     depends_on=depends_on, executor_generation=ev.spec.function.executor_generation)


def choose(ev: ContainerRequested, req: Request, workers: Sequence[WorkerState],
           catalogue: Catalogue) -> tuple[Choice, Candidate] | None:
    """The cost model's pick among the workers with room for `req`, or None (no worker has room)."""
    fit = [w for w in workers if eligible(req, w) and has_room(w, req)]
    if not fit:
        return None
    call = call_needs(ev, catalogue)
    can_restore = {w.worker_id: ("criu" in w.features) for w in fit}
    candidates = shared_candidates(catalogue, FLAVOR, {c for w in fit if can_restore[w.worker_id]
                                                        for c in w.restorable})
    if ev.checkpoint is not None:
        candidates.append(own_candidate(call, ev.checkpoint))
    views = [WorkerView(worker_id=w.worker_id,
                        restorable=(w.restorable | ({ev.checkpoint.checkpoint_id} if ev.checkpoint else set()))
                        if can_restore[w.worker_id] else frozenset()) for w in fit]
    choice = choose_checkpoint(call, candidates, views)
    return (choice, choice.candidate) if choice is not None else None


def summary(choice: Choice) -> dict[str, Any]:
    """What ContainerScheduled records of the choice: the pick, its estimate, the runner-up."""
    def part(e: Any) -> dict[str, Any]:
        return {"candidate": e.candidate, "worker_id": e.worker_id, "seconds": round(e.seconds, 4),
                "missing_imports": list(e.missing_imports)[:20]}

    out: dict[str, Any] = {"chosen": part(choice.estimate)}
    if choice.runner_up is not None:
        out["runner_up"] = part(choice.runner_up)
    out["considered"] = [[e.candidate, round(e.seconds, 4)] for e in choice.considered]
    return out


def ref_of(catalogue: Catalogue, checkpoint_id: str) -> CheckpointRef | None:
    for c in catalogue.checkpoints:
        if c.checkpoint_id == checkpoint_id:
            return c.ref
    return None


def shared_placement(ev: ContainerRequested, req: Request, workers: Sequence[WorkerState],
                     catalogues: Mapping[str, Catalogue]) -> tuple[Placement, Request, CheckpointRef | None,
                                                                  str, dict[str, Any], Any] | None:
    """(placement, request, checkpoint, note, choice, image) when the cost model decides, else None
    (the usual decision then applies)."""
    catalogue = catalogues.get(FLAVOR)
    if catalogue is None or catalogue.image is None or not may_share(ev):
        return None
    picked = choose(ev, req, workers, catalogue)
    if picked is None:
        return None
    choice, candidate = picked
    info = summary(choice)
    estimate = f"{choice.estimate.seconds * 1000:.0f} ms"
    runner = f"; runner-up {choice.runner_up.candidate} {choice.runner_up.seconds * 1000:.0f} ms" \
        if choice.runner_up else ""
    if candidate.kind == "shared":
        ref = ref_of(catalogue, candidate.checkpoint_id)
        if ref is not None:
            restoring = replace(req, features=req.features | {"criu"}, accelerator=ref.accelerator)
            note = f"shared checkpoint {ref.checkpoint_id}: estimated {estimate}{runner}"
            return Placement(choice.worker_id), restoring, ref, note, info, catalogue.image
    if candidate.kind == "own" and ev.checkpoint is not None:
        restoring = replace(req, features=req.features | {"criu"}, accelerator=ev.checkpoint.accelerator)
        return (Placement(choice.worker_id), restoring, ev.checkpoint,
                f"restored from {ev.checkpoint.checkpoint_id}: estimated {estimate}{runner}", info, None)
    return Placement(choice.worker_id), req, None, f"cold: estimated {estimate}{runner}", info, None
