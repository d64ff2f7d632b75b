"""Pools and the pure decision of how many workers each needs.

pool_delta states the policy in order, as beta9's scheduler does:
1. use ready capacity first: a pool with no backlog needs nothing new;
2. wait on pending capacity second: while a worker of the pool is still provisioning, do not start
   another for the same backlog;
3. only provision when neither fits, up to max_workers;
4. keep min_warm workers at all times; stop workers this controller started that have been idle
   (no containers) longer than idle_timeout, down to min_warm.

Besides the pools the file names there is always a pool `build` (BUILD_POOL): image builds run on its
workers, never in the image-builder and never on a pool user containers run on (placement matches
pool names only, and no request names `build` unless a user asks for it).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from levers9.contracts.images import BUILD_POOL


@dataclass(frozen=True)
class PoolConfig:
    name: str
    backend: str = "local"
    gpu_type: str = ""  # the one GPU type of this pool's workers ("" : no GPUs)
    gpus_per_worker: int = 0  # cards each worker has; with NVML the worker detects them instead
    worker_cpu_millicores: int = 0  # 0: what the machine has
    worker_memory_mib: int = 0
    min_warm: int = 1
    max_workers: int = 3
    idle_timeout_s: float = 60.0
    criu: bool = True  # checkpoint/restore on this pool's workers (when their `criu check` passes)
    # backend = "kubernetes" (backends_k8s.py, README "Kubernetes pools"): where and how its worker pods run
    namespace: str = "levers9-workers"  # the workers' namespace (k8s/rbac.yaml lets the controller in)
    image: str = "levers9:0.1.0"
    gpu_label: str = "levers9.io/gpu-type"  # node label whose value must equal gpu_type
    gpu_limits: bool = True  # request `nvidia.com/gpu: gpus_per_worker` (the device plugin enforces it)
    worker_secret: str = ""  # Secret in `namespace` with the pool's scoped database/S3 credentials
    cluster: str = ""  # backend = "cluster" (backends_cluster.py): "WORKSPACE/NAME" of the attached cluster whose agent runs its pods


@dataclass(frozen=True)
class PoolWorker:
    worker_id: str
    status: str  # provisioning | registered | ready | lost | drained
    managed: bool  # started by this controller's backend (only those are stopped when idle)
    busy: bool  # has containers
    idle_for_s: float = 0.0


@dataclass(frozen=True)
class Delta:
    start: int = 0
    stop: tuple[str, ...] = field(default=())
    reason: str = ""


ALIVE = {"provisioning", "registered", "ready"}
CLUSTER_REF = re.compile(r"[a-z0-9][-a-z0-9]{0,62}/[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")  # events.cluster.cluster_ref
# one warm builder, one at most: builds queue on it (one at a time) rather than each taking a machine;
# no checkpoints there (a build is not restored)
DEFAULT_BUILD_POOL = PoolConfig(BUILD_POOL, min_warm=1, max_workers=1, criu=False)


def pool_delta(pool: PoolConfig, workers: list[PoolWorker], backlog: int) -> Delta:
    alive = [w for w in workers if w.status in ALIVE]
    pending = [w for w in alive if w.status != "ready"]
    room = max(0, pool.max_workers - len(alive))
    if len(alive) < pool.min_warm:
        return Delta(start=min(room, pool.min_warm - len(alive)), reason=f"keep {pool.min_warm} warm")
    if backlog > 0:
        if pending:
            return Delta(reason=f"{backlog} waiting; {len(pending)} worker(s) already starting")
        if room:
            return Delta(start=1, reason=f"{backlog} container(s) waiting and no ready worker fits")
        return Delta(reason=f"{backlog} waiting but the pool is at max_workers={pool.max_workers}")
    idle = sorted((w for w in alive if w.status == "ready" and w.managed and not w.busy
                   and w.idle_for_s >= pool.idle_timeout_s), key=lambda w: (-w.idle_for_s, w.worker_id))
    surplus = len(alive) - pool.min_warm
    stop = tuple(w.worker_id for w in idle[:max(0, surplus)])
    return Delta(stop=stop, reason=f"idle longer than {pool.idle_timeout_s:.0f} s" if stop else "")


def with_unprojected(workers: list[PoolWorker], provisioned: dict[str, str], pool: str) -> list[PoolWorker]:
    """`workers` (the projection) and the workers this controller provisioned for `pool` that the
    projection does not show yet, as provisioning: without them two passes a few milliseconds apart
    both saw too few workers and both started one (min_warm 1 started two)."""
    seen = {w.worker_id for w in workers}
    return [*workers, *(PoolWorker(wid, "provisioning", managed=True, busy=False)
                        for wid, p in sorted(provisioned.items()) if p == pool and wid not in seen)]


def with_build_pool(pools: dict[str, PoolConfig]) -> dict[str, PoolConfig]:
    """`pools` and the build pool: the one they define, else DEFAULT_BUILD_POOL."""
    return {**pools, BUILD_POOL: pools.get(BUILD_POOL, DEFAULT_BUILD_POOL)}


def load_pools(path: str) -> dict[str, PoolConfig]:
    """Pools from a TOML file (`[pools.NAME]` tables), and the build pool; no file: one local pool
    `default` (and the build pool)."""
    return with_build_pool(_read_pools(path))


def _read_pools(path: str) -> dict[str, PoolConfig]:
    if not path:
        return {"default": PoolConfig("default")}
    file = Path(path)
    if not file.exists():
        raise SystemExit(f"pools file {path} does not exist (LEVERS9_POOLS_FILE)")
    data = tomllib.loads(file.read_text())
    pools = {}
    for name, table in data.get("pools", {}).items():
        unknown = set(table) - {f for f in PoolConfig.__dataclass_fields__ if f != "name"}
        if unknown:
            raise SystemExit(f"pool {name!r} in {path}: unknown keys {sorted(unknown)}")
        pools[name] = PoolConfig(name=name, **table)
        if pools[name].backend == "cluster" and not CLUSTER_REF.fullmatch(pools[name].cluster):
            raise SystemExit(f"pool {name!r} in {path}: backend 'cluster' needs `cluster = \"WORKSPACE/NAME\"` "
                             f"(the workspace that attached it, then its name; got {pools[name].cluster!r})")
    if not pools:
        raise SystemExit(f"{path} defines no [pools.NAME] table")
    return pools
