"""The fence of a lost worker: what it left on its node was stopped (a container id never runs twice)."""

from __future__ import annotations

from .events import Event


class WorkerFenced(Event, frozen=True, kw_only=True):
    """What a lost (or dead) run of a worker left on its node was stopped and removed: containers (a
    paused one too), mounts, network namespaces, address claims. Appended by whoever did it (the pool
    controller's reaper, or the worker's next start); the scheduler places its containers again only
    after it when the WorkerLost said `awaits_fence`."""
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    containers: list[str] = []  # the container ids removed from the node
    by: str = ""  # who fenced it: "pool-controller", "its next start"
