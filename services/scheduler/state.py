"""What the scheduler knows, as a pure fold of the events it consumes: `state = fold(state, msg, seq)`.

Two kinds of aggregate, each folded on its own (their events come through two consumers, so only the
order within one aggregate is given, never the order between them):
- a worker: its capacity and status (placement's WorkerState) and the slots reserved on it. Used
  capacity is always the sum of its slots: a reservation adds a slot once, a release removes the
  slot it names (its reservation's sequence, or any when 0), a release of a slot that is not there
  changes nothing;
- a container: its status, the worker it is on, and the ContainerRequested it was last asked with
  (what a re-request after a lost worker is built from).
Every aggregate remembers the sequence of its last event; an event at or below it changes nothing,
so applying the same event twice (a redelivery, or our own append seen again) is a no-op. That last
sequence is also what an append to the aggregate expects (optimistic concurrency).

The rules that read the state (who waits, which slots to release, which containers to request
again) are here too, pure, beside the fold.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Collection, Iterable, Mapping

import msgspec

from levers9.contracts import Message
from levers9.contracts import events as E
from levers9.contracts.events.cluster import ClusterAttached, ClusterDetached, ClusterShared, cluster_ref
from levers9.runtime.views import CONTAINER_STATUS, WORKER_STATUS, foreign_report, next_status

from .placement import Access, WorkerState

TERMINAL = frozenset({"stopped", "failed"})
WAITING = frozenset({"requested", "pending"})
ON_WORKER = frozenset({"scheduled", "starting", "ready"})

ContainerKey = tuple[str, str]  # (workspace, container_id)
Clusters = Mapping[str, tuple[str, frozenset[str]]]  # attached cluster -> (its owner, workspaces it admits)


@dataclass(frozen=True, slots=True)
class Slot:
    container_id: str
    workspace: str
    cpu_millicores: int
    memory_mib: int
    gpu_count: int
    reserved_seq: int


@dataclass(frozen=True, slots=True)
class Worker:
    state: WorkerState
    slots: Mapping[str, Slot] = field(default_factory=dict)  # container_id -> its slot here

    @property
    def worker_id(self) -> str:
        return self.state.worker_id

    @property
    def last_seq(self) -> int:
        return self.state.last_seq


@dataclass(frozen=True, slots=True)
class Container:
    workspace: str
    container_id: str
    status: str
    last_seq: int
    order: int  # the backlog is placed oldest first; a re-request keeps its place
    worker_id: str = ""
    reason: str = ""
    correlation_id: str = ""
    request: E.ContainerRequested | None = None

    @property
    def key(self) -> ContainerKey:
        return (self.workspace, self.container_id)

    @property
    def waiting(self) -> bool:
        """To be placed: requested or deferred, with the request to place."""
        return self.status in WAITING and self.request is not None


@dataclass(frozen=True)
class State:
    workers: Mapping[str, Worker] = field(default_factory=dict)
    containers: Mapping[ContainerKey, Container] = field(default_factory=dict)
    room: int = 0  # moves whenever capacity may have appeared: what was deferred may fit now
    clusters: Clusters = field(default_factory=dict)  # attached cluster -> (owner, workspaces it admits)


def new_worker(worker_id: str) -> Worker:
    """A worker we have heard of before its registration (capacity 0 until it registers)."""
    return Worker(WorkerState(worker_id=worker_id, pool="", status="", cpu_millicores=0, memory_mib=0))


# ---- workers -----------------------------------------------------------------------------------

def fold_worker(worker: Worker | None, ev: E.Event, seq: int) -> Worker:
    """A worker after one of its events."""
    if worker is not None and seq <= worker.last_seq:
        if isinstance(ev, E.WorkerProvisioned) and ev.cluster and worker.state.cluster != ev.cluster:
            # told late, by the clusters consumer (its WorkerProvisioned came after the workers consumer's)
            return Worker(replace(worker.state, cluster=ev.cluster), worker.slots)
        return worker  # applied already
    base = worker if worker is not None else new_worker(ev.aggregate_id)
    state = replace(base.state, last_seq=seq)
    slots = base.slots
    if isinstance(ev, E.WorkerSlotReserved):
        if ev.container_id not in slots:
            slot = Slot(ev.container_id, ev.workspace, ev.cpu_millicores, ev.memory_mib, ev.gpu_count, seq)
            slots = {**slots, ev.container_id: slot}
            state = replace(state, cpu_used=state.cpu_used + slot.cpu_millicores,
                            memory_used=state.memory_used + slot.memory_mib, gpu_used=state.gpu_used + slot.gpu_count)
    elif isinstance(ev, E.WorkerSlotReleased):
        held = slots.get(ev.container_id)
        if held is not None and ev.reserved_seq in (0, held.reserved_seq):
            slots = {k: v for k, v in slots.items() if k != ev.container_id}
            state = replace(state, cpu_used=state.cpu_used - held.cpu_millicores,
                            memory_used=state.memory_used - held.memory_mib, gpu_used=state.gpu_used - held.gpu_count)
    elif isinstance(ev, (E.WorkerCordoned, E.WorkerUncordoned)):
        state = replace(state, cordoned=isinstance(ev, E.WorkerCordoned))
    elif isinstance(ev, E.WorkerCatalogueChecked):
        state = replace(state, restorable=frozenset(ev.restorable))
    elif isinstance(ev, E.WorkerFenced):  # what it left is stopped: its containers may run elsewhere now
        state = replace(state, fence_awaited=False)
    else:
        state = _worker_status(state, ev)
        if isinstance(ev, (E.WorkerLost, E.WorkerRegistered)):  # a new run of it fenced what the old one left
            state = replace(state, fence_awaited=isinstance(ev, E.WorkerLost) and ev.awaits_fence)
    return Worker(state, slots)


def _worker_status(state: WorkerState, ev: E.Event) -> WorkerState:
    status = WORKER_STATUS.get(type(ev).__name__)
    if status is None:
        return state
    state = replace(state, status=status)
    if isinstance(ev, E.WorkerRegistered):  # a cluster's worker stays in the pool it was provisioned for
        state = replace(state, pool=state.pool if state.cluster else ev.pool, cpu_millicores=ev.cpu_millicores,
                        memory_mib=ev.memory_mib, gpu_type=ev.gpu_type, gpu_count=ev.gpu_count, features=frozenset(ev.features))
    elif isinstance(ev, E.WorkerProvisioned):
        state = replace(state, pool=ev.pool, cluster=ev.cluster)
    return state


def fold_cluster(clusters: Clusters, owner: str, ev: E.Event) -> Clusters:
    """The attached clusters after one cluster event of workspace `owner`: attaching admits the owner
    alone; sharing adds a workspace; detaching admits nobody. Only the cluster's owner shares or
    detaches it (the gateway refuses another's too). Keyed by the cluster's reference WORKSPACE/NAME,
    like the pools that name it and the workers provisioned on it."""
    name = cluster_ref(owner, getattr(ev, "name", ""))
    held = clusters.get(name)
    if held is not None and held[0] != owner:
        return clusters
    if isinstance(ev, ClusterAttached):
        return {**clusters, name: (owner, frozenset({owner}))}
    if isinstance(ev, ClusterShared) and held is not None and held[1]:
        return {**clusters, name: (owner, held[1] | {ev.workspace})}
    if isinstance(ev, ClusterDetached) and held is not None:
        return {**clusters, name: (owner, frozenset())}
    return clusters


def access_of(clusters: Clusters) -> Access:
    return {name: admitted for name, (_, admitted) in clusters.items()}


def takes_work(w: WorkerState) -> bool:
    return w.status == "ready" and not w.cordoned


def more_room(old: Worker | None, new: Worker) -> bool:
    """Whether something that did not fit before may fit on `new` now."""
    s = new.state
    if not takes_work(s):
        return False
    if old is None or not takes_work(old.state):
        return True
    o = old.state
    return (s.cpu_free > o.cpu_free or s.memory_free > o.memory_free or s.gpu_free > o.gpu_free
            or s.features != o.features or s.pool != o.pool or s.gpu_type != o.gpu_type)


# ---- containers --------------------------------------------------------------------------------

def fold_container(c: Container | None, msg: Message, seq: int) -> Container | None:
    """A container after one of its events; None for an event about a container we never saw that
    says nothing we keep (as the projection, which only updates a row that is there)."""
    if c is not None and seq <= c.last_seq:
        return c  # applied already
    ev, env = msg.event, msg.envelope
    if isinstance(ev, E.ContainerRequested):
        order = c.order if c is not None and c.request is not None else seq  # as requested_at: the first request
        return Container(env.workspace, ev.container_id, "requested", seq, order, correlation_id=env.correlation_id,
                         request=ev)
    status = CONTAINER_STATUS.get(env.type, "")
    if c is None:
        if not status:
            return None
        c = Container(env.workspace, ev.aggregate_id, status, seq, seq, correlation_id=env.correlation_id)
    if not status or foreign_report(c.worker_id, ev):
        return replace(c, last_seq=seq)
    return replace(c, status=next_status(c.status, status), last_seq=seq,
                   worker_id=getattr(ev, "worker_id", "") or c.worker_id,
                   reason=getattr(ev, "reason", "") or c.reason)


# ---- the whole state ---------------------------------------------------------------------------

def fold(state: State, msg: Message, seq: int) -> State:
    """The state after one event (any other aggregate's event changes nothing)."""
    ev = msg.event
    if ev.AGGREGATE == "worker":
        wid = ev.aggregate_id
        old = state.workers.get(wid)
        new = fold_worker(old, ev, seq)
        if new is old:
            return state
        return replace(state, workers={**state.workers, wid: new}, room=state.room + more_room(old, new))
    if ev.AGGREGATE == "cluster":  # who may use a cluster changed: what was deferred may fit now
        return replace(state, clusters=fold_cluster(state.clusters, msg.envelope.workspace, ev), room=state.room + 1)
    if ev.AGGREGATE == "container":
        key = (msg.envelope.workspace, ev.aggregate_id)
        before = state.containers.get(key)
        after = fold_container(before, msg, seq)
        if after is before or after is None:
            return state
        return replace(state, containers={**state.containers, key: after})
    return state


def fold_all(state: State, msgs: Iterable[tuple[Message, int]]) -> State:
    for msg, seq in msgs:
        state = fold(state, msg, seq)
    return state


# ---- rules over the state ----------------------------------------------------------------------

@dataclass(frozen=True)
class Release:
    worker_id: str
    slot: Slot
    reason: str
    correlation_id: str


def releases(workers: Mapping[str, Worker], containers: Mapping[ContainerKey, Container],
             only: Iterable[ContainerKey] | None = None,
             holders: Mapping[str, Collection[str]] | None = None) -> list[Release]:
    """Slots to free: their container stopped or failed, or moved on since the reservation (placed
    on another worker, or waiting again). A slot whose container we do not know stays. `only`:
    look at the slots of these containers alone; `holders`: the workers holding a slot for each
    container id, when the caller keeps that index (else every worker is looked at)."""
    if only is None:
        held = [(w, s) for w in workers.values() for s in w.slots.values()]
    else:
        held = []
        for ws, cid in only:
            for w in (workers[wid] for wid in holders.get(cid, ())) if holders is not None else workers.values():
                slot = w.slots.get(cid)
                if slot is not None and slot.workspace == ws:
                    held.append((w, slot))
    out = []
    for w, slot in held:
        c = containers.get((slot.workspace, slot.container_id))
        if c is None:
            continue
        moved = c.last_seq > slot.reserved_seq and (c.worker_id != w.worker_id or c.status in WAITING)
        if c.status in TERMINAL or moved:
            out.append(Release(w.worker_id, slot, c.status, c.correlation_id))
    return out


def lost_containers(workers: Mapping[str, Worker], containers: Iterable[Container]) -> list[Container]:
    """Containers placed on a worker that is lost: to be requested again, elsewhere, once what the
    worker left on its node is stopped (WorkerFenced, when its WorkerLost awaits one): a container id
    never runs on two workers at once."""
    out = []
    for c in containers:
        w = workers.get(c.worker_id) if c.status in ON_WORKER else None
        if w is not None and w.state.status == "lost" and not w.state.fence_awaited and c.request is not None:
            out.append(c)
    return out


def re_request(c: Container) -> E.ContainerRequested:
    """The request of a container whose worker was lost: the same request (spec and all), one
    attempt more. The lost worker is not excluded: it takes no work while lost, and when it
    registers again it is a new run with its slots released (excluding it left a container whose
    only worker was restarted waiting for ever)."""
    assert c.request is not None
    return msgspec.structs.replace(c.request, reason=f"worker {c.worker_id} lost", attempt=c.request.attempt + 1)


def holding_a_slot(backlog: Iterable[Container], workers: Mapping[str, Worker],
                   holders: Mapping[str, Collection[str]]) -> list[Container]:
    """Waiting containers that hold a slot somewhere: a placement of theirs is in flight, or was
    abandoned (a scheduler stopped between its reservation and its ContainerScheduled)."""
    return [c for c in backlog
            if any(workers[w].slots[c.container_id].workspace == c.workspace for w in holders.get(c.container_id, ()))]


def abandoned(held: Iterable[Container], since: Mapping[ContainerKey, float], now: float,
              after_s: float) -> list[Container]:
    """Of the containers holding a slot while they wait, those that have for `after_s` (a placement
    in flight takes milliseconds). Asked for again with optimistic concurrency on the container, a
    scheduler that is still placing it after all loses either way, and the slot is released as any
    slot of a container that moved on."""
    return [c for c in held if now - since.get(c.key, now) >= after_s]


def asked_again(c: Container, reason: str) -> E.ContainerRequested:
    """The same request, again (its place in the backlog is kept)."""
    assert c.request is not None
    return msgspec.structs.replace(c.request, reason=reason)


def forget_finished(containers: Mapping[ContainerKey, Container],
                    workers: Iterable[Worker]) -> list[ContainerKey]:
    """Stopped or failed containers that hold no slot: nothing about them can matter any more."""
    held = {(s.workspace, s.container_id) for w in workers for s in w.slots.values()}
    return [k for k, c in containers.items() if c.status in TERMINAL and k not in held]
