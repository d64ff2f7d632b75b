"""Events of workers (platform aggregates, workspace `_sys`): provisioned, registered, ready, lost,
fenced, drained, cordoned, their capacity taken and given back, and the catalogue each can restore.

Subjects are `levers9._sys.worker.<worker_id>.<EventType>`. A slot reservation is appended with
optimistic concurrency on the worker's subject: two replicas of the scheduler cannot both take the
last slot.
"""

from __future__ import annotations

from .base import Event


class WorkerProvisioned(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    pool: str = "default"
    backend: str = "local"
    cluster: str = ""  # backend "cluster": the attached cluster it runs on (only its workspaces' work goes there)


class WorkerRegistered(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    pool: str = "default"
    cpu_millicores: int
    memory_mib: int
    gpu_type: str = ""
    gpu_count: int = 0
    gpu_source: str = ""  # detected (NVML) | configured (the pool's gpu_type, gpus_per_worker) | "" (none)
    gpu_ids: list[str] = []  # the cards offered: uuids when detected, indices when configured
    gpu_driver: str = ""  # the NVIDIA driver version NVML reported
    features: list[str] = []  # runtime features, e.g. "runc", "criu"
    address: str = ""
    token_id: str = ""  # the worker token it was started with (scope worker:<id>)


class WorkerReady(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str


class WorkerLost(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    reason: str = ""
    awaits_fence: bool = False  # its containers are placed again only after WorkerFenced (below)


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


class WorkerDrained(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str


class WorkerCordoned(Event, frozen=True, kw_only=True):
    """No new placements; `drain` also stops its containers so they are placed elsewhere."""
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    drain: bool = False


class WorkerUncordoned(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str


class WorkerSlotReserved(Event, frozen=True, kw_only=True):
    """Capacity taken on a worker, with optimistic concurrency on its subject: one takes the last slot."""
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    container_id: str
    workspace: str
    cpu_millicores: int
    memory_mib: int
    gpu_count: int = 0


class WorkerSlotReleased(Event, frozen=True, kw_only=True):
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    container_id: str
    reason: str = ""
    reserved_seq: int = 0  # the reservation released (its stream sequence); 0: whichever holds the slot


class WorkerCatalogueChecked(Event, frozen=True, kw_only=True):
    """Which of a catalogue's checkpoints this worker can restore, and why it dropped the others
    (sandbox settings that differ from those they were captured with)."""
    AGGREGATE = "worker"
    ID_FIELD = "worker_id"
    SYSTEM = True
    worker_id: str
    catalogue_id: str
    restorable: list[str] = []
    dropped: dict[str, str] = {}  # checkpoint id -> why
