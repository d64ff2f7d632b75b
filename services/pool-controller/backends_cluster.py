"""Pool backend `cluster`: worker pods on a cluster a workspace attached (`cluster = "NAME"` in the pool).

Nothing connects into that cluster: its agent (levers9.agent) holds one stream open to a gateway, and
that gateway answers core NATS requests on `levers9rpc.cluster.<name>.<op>` (never the event log: a
start carries the worker's token and NATS user) for as long as the agent is connected. Here:
- start: the worker's pod, described by `start_request` (pure): the pool's shape, the allow-listed
  settings (k8s_manifests.worker_env: addresses and tunables, never a credential) and the worker's own
  files (its token, its own NATS user, the workers' signing key, the signers); the agent builds the
  same Secret and Pod as the Kubernetes backend from them, in its own namespace;
- stop: delete that worker's pod and Secret;
- exited: the workers whose pods the agent saw end (asked every few seconds).
A start that fails (no agent connected, the agent's API call refused) reports the worker as exited
at once, with the reason logged and shown in the pool's last decision (`note`).

The Backend calls are synchronous and made on the controller's event loop: each request runs as a
task of that loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict
from typing import Any, Callable

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from levers9.runtime.config import Settings
from levers9.runtime.k8s_manifests import worker_env
from levers9.runtime.nats_auth import CLUSTER_RPC

from .backends import Backend, worker_bus_files
from .pools import PoolConfig

log = logging.getLogger("levers9.pool_controller.cluster")

REQUEST_TIMEOUT_S = 15.0  # the agent creates a Secret and a Pod within this
EXITED_EVERY_S = 3.0
POD_FIELDS = ("name", "image", "gpu_type", "gpu_label", "gpu_limits", "gpus_per_worker", "worker_cpu_millicores",
              "worker_memory_mib", "criu", "worker_secret")


def rpc_subject(cluster: str, op: str) -> str:
    return f"{CLUSTER_RPC}.{cluster}.{op}"


def start_request(pool: PoolConfig, worker_id: str, token: str, settings: Settings,
                  files: dict[str, str]) -> dict[str, Any]:
    """What the agent needs to run this worker: the pool's shape (never its namespace: the agent's
    own), the allow-listed settings, and the worker's own files (token, its NATS user, keys)."""
    shape = {k: v for k, v in asdict(pool).items() if k in POD_FIELDS}
    return {"worker_id": worker_id, "pool": shape, "env": worker_env(settings), "files": {"token": token, **files}}


def refusal(cluster: str, error: BaseException | None, reply: dict[str, Any] | None) -> str:
    """Why a request to the cluster's agent did not succeed ("" when it did)."""
    if isinstance(error, NoRespondersError):
        return f"cluster {cluster!r}: its agent is not connected (run `levers9 agent` there; see `levers9 clusters list`)"
    if isinstance(error, (NatsTimeout, asyncio.TimeoutError)):
        return f"cluster {cluster!r}: its agent did not answer within {REQUEST_TIMEOUT_S:.0f} s"
    if error is not None:
        return f"cluster {cluster!r}: {type(error).__name__}: {error}"
    if not reply or not reply.get("ok"):
        return f"cluster {cluster!r}: {(reply or {}).get('error') or 'the agent refused'}"
    return ""


class ClusterBackend(Backend):
    name = "cluster"

    def __init__(self, settings: Settings, issuer: str, bus: Callable[[], Any]) -> None:
        self.settings, self.issuer, self.bus = settings, issuer, bus
        self.workers: dict[str, str] = {}  # worker -> its cluster
        self.gone: dict[str, str] = {}  # worker -> why, not yet reported by exited()
        self.problems: dict[str, str] = {}  # cluster -> the last failure, until a start succeeds
        self.tasks: set[asyncio.Task] = set()
        self.polling: set[str] = set()

    def start_worker(self, pool: PoolConfig, worker_id: str, token: str) -> None:
        if not pool.cluster:
            self._failed(pool.cluster, worker_id, f"pool {pool.name!r}: backend 'cluster' needs `cluster = \"NAME\"`")
            return
        self.workers[worker_id] = pool.cluster
        body = start_request(pool, worker_id, token, self.settings, worker_bus_files(self.issuer, worker_id))
        self._spawn(self._start(pool.cluster, worker_id, body))
        if pool.cluster not in self.polling:
            self.polling.add(pool.cluster)
            self._spawn(self._poll_exited(pool.cluster))

    def stop_worker(self, worker_id: str) -> None:
        cluster = self.workers.pop(worker_id, None)
        if cluster:
            self._spawn(self._request(cluster, "stop", {"worker_id": worker_id}))

    def exited(self) -> list[str]:
        gone, self.gone = list(self.gone), {}
        return gone

    def note(self, pool: PoolConfig) -> str:
        problem = self.problems.get(pool.cluster, "")
        return f" (last start failed: {problem})" if problem else ""

    # ---- requests ------------------------------------------------------------------------------

    async def _start(self, cluster: str, worker_id: str, body: dict[str, Any]) -> None:
        why = await self._request(cluster, "start", body)
        if why:
            self.workers.pop(worker_id, None)
            self._failed(cluster, worker_id, why)
        else:
            self.problems.pop(cluster, None)
            log.info("worker %s: pod started on cluster %s", worker_id, cluster)

    async def _request(self, cluster: str, op: str, body: dict[str, Any]) -> str:
        """The failure of one request ("" when the agent did it)."""
        error: BaseException | None = None
        reply = None
        try:
            msg = await self.bus().nc.request(rpc_subject(cluster, op), json.dumps(body).encode(),
                                              timeout=REQUEST_TIMEOUT_S)
            reply = json.loads(msg.data or b"{}")
        except (NoRespondersError, NatsTimeout, asyncio.TimeoutError, ValueError, OSError) as e:
            error = e
        return refusal(cluster, error, reply)

    async def _poll_exited(self, cluster: str) -> None:
        """The workers whose pods the agent saw end; an agent not connected has nothing to say."""
        while True:
            await asyncio.sleep(EXITED_EVERY_S)
            try:
                msg = await self.bus().nc.request(rpc_subject(cluster, "exited"), b"{}", timeout=REQUEST_TIMEOUT_S)
                reported = json.loads(msg.data or b"{}").get("exited") or {}
            except (NoRespondersError, NatsTimeout, asyncio.TimeoutError, ValueError, OSError):
                continue
            for worker_id, why in reported.items():
                if self.workers.get(worker_id) == cluster:  # never another cluster's worker
                    del self.workers[worker_id]
                    log.warning("worker %s on cluster %s: %s", worker_id, cluster, why)
                    self.gone[worker_id] = why

    def _failed(self, cluster: str, worker_id: str, why: str) -> None:
        log.error("worker %s: %s", worker_id, why)
        self.problems[cluster] = why
        self.gone[worker_id] = why

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
