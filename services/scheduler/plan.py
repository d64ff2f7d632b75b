"""One scheduling pass over the backlog: what to append for each waiting container. Pure; no I/O.

The containers are decided oldest first against one running view of the workers: each placement
takes its capacity in the view before the next container is decided, so a pass never plans more
onto a worker than it has, even though the reservations reach the log later, one by one.
For each container:
1. it fits: place it (reserve the slot, then schedule it). Never on a worker that holds a slot for it
   already (another scheduler's placement in flight, or one that lost): a second reservation of the
   same slot would be one slot in the log, and the release of either would free the other;
2. it does not fit, but a worker of its pool is being refreshed (an append there just conflicted),
   or it would fit only where a slot for it is held (a placement of it in flight): hold it, the next
   pass decides on fresh state;
3. it does not fit: defer it, with the reason; a container already deferred for that same reason
   is left as it is (no new event).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Collection, Iterable, Mapping

import msgspec

from levers9.contracts.catalogue import Catalogue
from levers9.contracts.events import ContainerRequested

from .decision import Decision, decide
from .placement import Access, WorkerState, admitted_workers, has_room, not_admitted, reserve
from .state import Container


@dataclass(frozen=True)
class Place:
    container: Container
    decision: Decision

    @property
    def worker_id(self) -> str:
        assert self.decision.worker_id is not None
        return self.decision.worker_id


@dataclass(frozen=True)
class Defer:
    container: Container
    reason: str
    append: bool  # False: deferred already for this reason


@dataclass(frozen=True)
class Hold:
    container: Container


Step = Place | Defer | Hold


class View:
    """The workers as a pass sees them: their states plus what the pass has placed so far."""

    def __init__(self, workers: Mapping[str, WorkerState]) -> None:
        self.states = list(workers.values())
        self.index = {w.worker_id: i for i, w in enumerate(self.states)}

    def take(self, d: Decision) -> None:
        i = self.index[d.placement.worker_id or ""]
        self.states[i] = reserve(self.states[i], d.request, self.states[i].last_seq)

    def get(self, worker_id: str) -> WorkerState:
        return self.states[self.index[worker_id]]


def plan(workers: Mapping[str, WorkerState], backlog: Iterable[Container],
         held_pools: frozenset[str] = frozenset(),
         holders: Mapping[str, Collection[str]] | None = None,
         catalogues: Mapping[str, Catalogue] | None = None, access: Access | None = None) -> list[Step]:
    """The steps for `backlog` (in order) on `workers` (those being refreshed left out: their pools
    are `held_pools`); `holders`: the workers that hold a slot for a container, by container id;
    `access`: which workspaces each attached cluster admits (its workers are seen by those alone)."""
    view = View(workers)
    access = access or {}
    clustered = any(w.cluster for w in view.states)  # else every worker takes anyone's work: no filter
    holders = holders or {}
    steps: list[Step] = []
    last: Decision | None = None  # the last placement, and the request it was for
    last_shape: tuple = ()
    for c in backlog:
        request = c.request
        assert request is not None
        original = request
        held_by = holders.get(c.container_id, ())
        if held_by:
            request = msgspec.structs.replace(request, excluded_workers=sorted({*request.excluded_workers, *held_by}))
        shape = (_shape(request), c.workspace if clustered else "")
        states = admitted_workers(c.workspace, view.states, access) if clustered else view.states
        if last is not None and shape == last_shape and has_room(view.get(last.worker_id or ""), last.request):
            # the same request as the one just placed, and its worker still has room: that worker
            # is still the best (it only got fuller, nothing else changed), so decide() would say so
            d = replace(last, request=replace(last.request, container_id=c.container_id))
        else:
            d = decide(request, states, catalogues)
        if d.worker_id is not None:
            view.take(d)
            steps.append(Place(c, d))
            last, last_shape = d, shape
            continue
        if held_by:  # the reason as if no slot were held: it names capacity, not a race
            d = decide(original, states)
        if d.worker_id is not None or (request.pool or "default") in held_pools:
            steps.append(Hold(c))  # it fits only where a placement of it is in flight, or on fresher state
        else:
            reason = _why_deferred(d.reason, c.workspace, request.pool or "default", states, view.states, access)
            steps.append(Defer(c, reason, append=c.status == "requested" or c.reason != reason))
    return steps


def _why_deferred(reason: str, workspace: str, pool: str, admitted: list[WorkerState], every: list[WorkerState],
                  access: Access) -> str:
    """The reason, or that the pool's only workers are a cluster this workspace may not use."""
    if admitted is every or any(w.pool == pool for w in admitted):
        return reason
    return not_admitted(workspace, pool, every, access) or reason


def _shape(ev: ContainerRequested) -> tuple:
    """What decide() reads of a request (all of it but the container id)."""
    return (ev.resources, ev.pool, ev.excluded_workers, ev.checkpoint, ev.note, ev.imports, ev.spec)
