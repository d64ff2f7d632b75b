"""The scheduler's state held in memory, kept current in place with the same per-aggregate folds as
`state.fold` (a copy of a 5,000-container map per event would cost more than the decision itself).

It is fed from two places: the batches its consumers deliver (before the projection commits them),
and the events this scheduler itself appended with optimistic concurrency, as soon as the append is
acknowledged (nothing else can be between them and the aggregate's previous event, so folding them
early is folding them in order; when the consumer delivers them again they are no-ops).
It also keeps the backlog (containers waiting to be placed) in placement order, who holds a slot
for each container, and per consumer the last sequence it folded: a batch delivered again (a
retried projection commit, a consumer resuming from the projection's older position) is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

from levers9.contracts import InvalidName, Message, subjects
from levers9.runtime.consumer import Delivery

from .state import (
    Clusters,
    Container,
    ContainerKey,
    State,
    Worker,
    fold_cluster,
    fold_container,
    fold_worker,
    more_room,
)


@dataclass
class Touched:
    """What a batch changed: the scheduler reacts to these only."""
    containers: set[ContainerKey] = field(default_factory=set)
    workers: set[str] = field(default_factory=set)
    room: bool = False  # something deferred may fit now
    waiting: bool = False  # something new to place


class Memory:
    def __init__(self, state: State | None = None, seen: dict[str, int] | None = None) -> None:
        state = state or State()
        self.workers: dict[str, Worker] = dict(state.workers)
        self.containers: dict[ContainerKey, Container] = dict(state.containers)
        self.room = state.room
        self.clusters: Clusters = dict(state.clusters)  # attached clusters: who may use their workers
        self.seen: dict[str, int] = dict(seen or {})  # consumer (projection name) -> last sequence folded
        self.waiting: dict[ContainerKey, int] = {}  # the backlog: key -> its order
        # how often each worker changed by an event we did not append ourselves: a decision made on
        # a worker is only appended while this has not moved (our own appends keep it valid)
        self.foreign: dict[str, int] = {}
        self.own: set[str] = set()  # ids of our appends not yet seen back from the consumer
        self.holders: dict[str, set[str]] = {}  # container id -> the workers holding a slot for it
        for w in self.workers.values():
            for cid in w.slots:
                self.holders.setdefault(cid, set()).add(w.worker_id)
        self._sorted = True
        for c in sorted(self.containers.values(), key=lambda c: (c.order, c.container_id)):
            self._index(c)

    def state(self) -> State:
        return State(dict(self.workers), dict(self.containers), self.room, dict(self.clusters))

    # ---- folding -------------------------------------------------------------------------------

    def apply(self, msg: Message, seq: int, touched: Touched | None = None) -> bool:
        """Fold one event in place (noting in `touched` what it changed); False when it was a no-op."""
        touched = touched if touched is not None else Touched()
        ev = msg.event
        if ev.AGGREGATE == "worker":
            wid = ev.aggregate_id
            old = self.workers.get(wid)
            new = fold_worker(old, ev, seq)
            if new is old:
                return False
            self.workers[wid] = new
            touched.workers.add(wid)
            if more_room(old, new):
                self.room += 1
                touched.room = True
            container_id = getattr(ev, "container_id", None)
            if container_id is not None:  # a slot event: its container may have a slot to release
                self._hold(container_id, wid, container_id in new.slots)
                touched.containers.add((getattr(ev, "workspace", ""), container_id))
            return True
        if ev.AGGREGATE == "container":
            key = (msg.envelope.workspace, ev.aggregate_id)
            before = self.containers.get(key)
            after = fold_container(before, msg, seq)
            if after is before or after is None:
                return False
            self.containers[key] = after
            touched.containers.add(key)
            touched.waiting |= self._index(after)
            return True
        if ev.AGGREGATE == "cluster":  # a share may let what was deferred run there now
            self.clusters = fold_cluster(self.clusters, msg.envelope.workspace, ev)
            self.room += 1
            touched.room = True
            return True
        return False

    def observe(self, consumer: str, batch: Sequence[Delivery]) -> Touched:
        """Fold what a consumer delivered, skipping what this consumer already brought."""
        touched = Touched()
        seen = self.seen.get(consumer, 0)
        for d in batch:
            if d.seq <= seen:
                continue
            if d.message is None or d.error is not None:
                self.touch(d.subject, d.seq)
                continue
            ours = d.message.envelope.id in self.own
            self.own.discard(d.message.envelope.id)
            if self.apply(d.message, d.seq, touched) and not ours and d.message.event.AGGREGATE == "worker":
                self._foreign(d.message.event.aggregate_id)
        if batch:
            self.seen[consumer] = max(seen, batch[-1].seq)
        return touched

    def _hold(self, container_id: str, worker_id: str, held: bool) -> None:
        if held:
            self.holders.setdefault(container_id, set()).add(worker_id)
            return
        workers = self.holders.get(container_id)
        if workers is not None:
            workers.discard(worker_id)
            if not workers:
                del self.holders[container_id]

    def _foreign(self, worker_id: str) -> None:
        self.foreign[worker_id] = self.foreign.get(worker_id, 0) + 1

    def touch(self, subject: str, seq: int) -> None:
        """An event that does not decode (dead-lettered) still moves its aggregate's last sequence:
        an append expecting the sequence before it would only conflict."""
        try:
            s = subjects.parse(subject)
        except InvalidName:
            return
        if s.aggregate == "worker" and s.aggregate_id in self.workers:
            w = self.workers[s.aggregate_id]
            if seq > w.last_seq:
                self.workers[s.aggregate_id] = Worker(replace(w.state, last_seq=seq), w.slots)
                self._foreign(s.aggregate_id)
        elif s.aggregate == "container" and (s.workspace, s.aggregate_id) in self.containers:
            c = self.containers[(s.workspace, s.aggregate_id)]
            if seq > c.last_seq:
                self.containers[c.key] = replace(c, last_seq=seq)

    def forget(self, keys: Iterable[ContainerKey]) -> None:
        for key in keys:
            self.containers.pop(key, None)
            self.waiting.pop(key, None)

    # ---- the backlog ---------------------------------------------------------------------------

    def _index(self, c: Container) -> bool:
        """Keep the backlog in step with one container; True when it joined the backlog."""
        if not c.waiting:
            self.waiting.pop(c.key, None)
            return False
        if c.key in self.waiting:
            return False
        if self.waiting and c.order < next(reversed(self.waiting.values())):
            self._sorted = False  # a re-request keeps its older place
        self.waiting[c.key] = c.order
        return True

    def backlog(self) -> Iterable[Container]:
        """Waiting containers, oldest first."""
        if not self._sorted:
            self.waiting = dict(sorted(self.waiting.items(), key=lambda kv: (kv[1], kv[0][1])))
            self._sorted = True
        for key in self.waiting:  # not copied: read it through before memory changes again
            c = self.containers.get(key)
            if c is not None and c.waiting:
                yield c
