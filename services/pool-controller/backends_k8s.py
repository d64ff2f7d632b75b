"""Workers as pods: the Kubernetes pool backend (`backend = "kubernetes"` in a pool's table).

start_worker creates the worker's own Secret, then its Pod (backends_k8s_manifests.py says what
they hold); stop_worker deletes both, the pod with a grace period in which the worker stops its
containers and leaves. exited() only reads what a watcher thread per namespace found: it lists the
managed pods, then watches them from that list's resourceVersion, and relists whenever the watch
ends or fails (a list also finds pods deleted while nobody watched). A worker whose pod failed,
succeeded or was deleted by someone else is reported once; its pod and Secret are then deleted.

The client is the official `kubernetes` package, configured in-cluster (the pool controller's
ServiceAccount, k8s/rbac.yaml) or from a kubeconfig ($KUBECONFIG, else ~/.kube/config). API errors
never escape into the controller's loop: they are logged with what to check, kept in `errors`, and
a worker whose pod could not be created is reported by exited(), so the controller declares it lost
at once instead of waiting for the provisioning timeout.

Calls in start_worker/stop_worker are synchronous, bounded by `request_timeout_s`; the watch runs in
threads, never on the controller's asyncio loop.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import deque
from typing import Any, cast

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from levers9.runtime.config import Settings

from .backends import Backend, worker_bus_files
from .backends_k8s_manifests import (
    GRACE_S,
    SELECTOR,
    gone_workers,
    object_name,
    pod_gone,
    pod_manifest,
    pod_worker,
    pool_problems,
    secret_manifest,
)
from .pools import PoolConfig

log = logging.getLogger("levers9.pool_controller.kubernetes")

HINTS = {
    401: "the controller's credentials were refused (in-cluster token or kubeconfig user)",
    403: "the pool controller may not do this: k8s/rbac.yaml grants it pods and secrets in the workers' "
         "namespace only; is the pool's `namespace` that one?",
    404: "not found: does the pool's namespace exist?",
    409: "it already exists (a worker id used twice, or a leftover of an earlier controller)",
    422: "the API server rejected the object as invalid",
}
# the client validates bodies itself (pydantic; a ValueError) before sending them
CLIENT_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError)


def describe(error: BaseException, action: str) -> str:
    """One line that says what failed, how, and what to check."""
    if isinstance(error, ApiException):
        hint = HINTS.get(error.status or 0, "the API server failed; a new worker is tried on the next pass"
                         if (error.status or 0) >= 500 else "")
        return f"{action}: HTTP {error.status} {error.reason}: {_status_message(error)}" + (f" ({hint})" if hint else "")
    if isinstance(error, ValueError):
        return f"{action}: the client refused the object as invalid: {' '.join(str(error).split())[:300]}"
    return f"{action}: the API server is unreachable: {error}"


def _status_message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message") or "").strip() or "no message"
    except ValueError:
        return (error.body or "no message")[:200]


def load_api_client() -> client.ApiClient:
    """In a pod: its ServiceAccount. Elsewhere: $KUBECONFIG (or ~/.kube/config)."""
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(cfg)
        return config.new_client_from_config(config_file=os.environ.get("KUBECONFIG") or None)
    except (config.ConfigException, OSError) as e:
        raise SystemExit(f"pool backend 'kubernetes': no cluster configuration ({e}); run the pool controller "
                         "in the cluster with k8s/rbac.yaml's ServiceAccount, or set KUBECONFIG") from e


class KubernetesBackend(Backend):
    name = "kubernetes"

    def __init__(self, settings: Settings, issuer: str = "", api: client.CoreV1Api | None = None, *,
                 watch_timeout_s: int = 60, request_timeout_s: float = 10.0) -> None:
        self.settings, self.issuer = settings, issuer
        self.api = api or client.CoreV1Api(load_api_client())
        self.watch_timeout_s, self.timeout = watch_timeout_s, request_timeout_s
        self.lock = threading.Lock()
        self.workers: dict[str, PoolConfig] = {}  # running workers this backend started
        self.gone: dict[str, str] = {}  # worker -> why, not yet reported by exited()
        self.errors: deque[str] = deque(maxlen=50)
        self.stopping = threading.Event()
        self.watchers: dict[str, threading.Thread] = {}

    # ---- the Backend calls -----------------------------------------------------------------------

    def start_worker(self, pool: PoolConfig, worker_id: str, token: str) -> None:
        problem = "; ".join(pool_problems(pool)) or self._create(pool, worker_id, token)
        if problem:
            self._failed(worker_id, problem)
            return
        with self.lock:
            self.workers[worker_id] = pool
        self._watch(pool.namespace)
        log.info("worker %s: pod %s/%s created", worker_id, pool.namespace, object_name(worker_id))

    def _create(self, pool: PoolConfig, worker_id: str, token: str) -> str:
        """Create the worker's Secret, then its Pod; what failed ("" if nothing)."""
        bus = worker_bus_files(self.issuer, worker_id)
        name, ns = object_name(worker_id), pool.namespace
        try:
            self.api.create_namespaced_secret(ns, cast(Any, secret_manifest(pool, worker_id, token, bus)),
                                              _request_timeout=self.timeout)
        except CLIENT_ERRORS as e:
            return describe(e, f"creating secret {ns}/{name}")
        try:
            self.api.create_namespaced_pod(ns, cast(Any, pod_manifest(pool, worker_id, self.settings, sorted(bus))),
                                           _request_timeout=self.timeout)
        except CLIENT_ERRORS as e:
            self._delete(ns, name, pod=False)  # its token must not outlive the attempt
            return describe(e, f"creating pod {ns}/{name}")
        return ""

    def stop_worker(self, worker_id: str) -> None:
        with self.lock:
            pool = self.workers.pop(worker_id, None)
        if pool is not None:
            self._delete(pool.namespace, object_name(worker_id))

    def exited(self) -> list[str]:
        with self.lock:
            gone, self.gone = list(self.gone), {}
        return gone

    def close(self) -> None:
        """Stop the watchers (each ends within watch_timeout_s; they are daemon threads)."""
        self.stopping.set()

    # ---- watching --------------------------------------------------------------------------------

    def refresh(self, namespace: str) -> str:
        """List the managed pods of `namespace`, note the workers gone; the list's resourceVersion."""
        with self.lock:  # before the list: every worker known now has its pod created already
            known = {wid for wid, p in self.workers.items() if p.namespace == namespace}
        resp: Any = self.api.list_namespaced_pod(namespace, label_selector=SELECTOR, _preload_content=False,
                                            _request_timeout=self.timeout)
        body = json.loads(resp.data)
        for wid, why in gone_workers(known, body.get("items") or []).items():
            self._lost(wid, why)
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, namespace: str) -> None:
        with self.lock:
            if namespace in self.watchers or self.stopping.is_set():
                return
            thread = threading.Thread(target=self._watch_loop, args=(namespace,), daemon=True,
                                      name=f"levers9-k8s-watch-{namespace}")
            self.watchers[namespace] = thread
        thread.start()

    def _watch_loop(self, namespace: str) -> None:
        while not self.stopping.is_set():
            try:
                version = self.refresh(namespace)
                self._follow(namespace, version)
            except CLIENT_ERRORS as e:
                self._error(describe(e, f"watching pods in {namespace}"))
                self.stopping.wait(2.0)

    def _follow(self, namespace: str, version: str) -> None:
        w = watch.Watch()
        for event in w.stream(self.api.list_namespaced_pod, namespace, label_selector=SELECTOR,
                              resource_version=version, timeout_seconds=self.watch_timeout_s, deserialize=False):
            if self.stopping.is_set() or event.get("type") == "ERROR":
                w.stop()  # an expired resourceVersion or a failure: relist
                return
            pod: dict[str, Any] = event.get("object") or {}
            why = pod_gone(pod, event.get("type", ""))
            if why and pod_worker(pod):
                self._lost(pod_worker(pod), why)

    # ---- helpers ---------------------------------------------------------------------------------

    def _lost(self, worker_id: str, why: str) -> None:
        with self.lock:
            pool = self.workers.pop(worker_id, None)
            if pool is None:
                return  # stopped by us, or reported already
            self.gone[worker_id] = why
        log.warning("worker %s: %s", worker_id, why)
        self._delete(pool.namespace, object_name(worker_id))  # its token and NATS user go with it

    def _failed(self, worker_id: str, why: str) -> None:
        self._error(f"worker {worker_id}: {why}")
        with self.lock:
            self.gone[worker_id] = why

    def _error(self, message: str) -> None:
        log.error("%s", message)
        self.errors.append(message)

    def _delete(self, namespace: str, name: str, pod: bool = True) -> None:
        calls = [("pod", self.api.delete_namespaced_pod)] if pod else []
        for kind, call in [*calls, ("secret", self.api.delete_namespaced_secret)]:
            try:
                call(name, namespace, grace_period_seconds=GRACE_S if kind == "pod" else None,
                     _request_timeout=self.timeout)
            except ApiException as e:
                if e.status != 404:  # gone already is what we wanted
                    self._error(describe(e, f"deleting {kind} {namespace}/{name}"))
            except CLIENT_ERRORS as e:
                self._error(describe(e, f"deleting {kind} {namespace}/{name}"))
