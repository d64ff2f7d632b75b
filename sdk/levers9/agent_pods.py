"""What an attached cluster's agent does in its cluster: worker pods and their Secrets, in its own
namespace, built by the same functions as the Kubernetes pool backend's (levers9.runtime.k8s_manifests).

A start request (levers9.pool_controller.backends_cluster.start_request) is read defensively: only
the pool's shape, only the allow-listed settings (never a credential), only the worker's own files;
the namespace is always the agent's. Loopback server URLs in the settings (a platform run on one
machine) are rewritten to the host the agent reached the gateway at, which is the only address of
the platform this cluster is known to reach. The pool's own credentials (its database role, S3 keys)
come from the pool's Secret in this namespace (`worker_secret`), which the cluster's admin creates.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import urlsplit

from levers9.contracts.ids import InvalidName, check_id
from levers9.runtime import k8s_manifests as M
from levers9.runtime.hosts import LOOPBACK, rewrite_url

log = logging.getLogger("levers9.agent")

BUS_FILES = ("nats.creds", "worker.sign", "signers.json")
URL_SETTINGS = ("nats_url", "s3_endpoint", "registry", "gateway_url")


@dataclass(frozen=True)
class AgentPool:
    """A pool as the agent's pods see it (k8s_manifests.PoolConfig); its namespace is the agent's."""
    name: str
    namespace: str
    image: str = "levers9:0.1.0"
    gpu_type: str = ""
    gpu_label: str = "levers9.io/gpu-type"
    gpu_limits: bool = True
    gpus_per_worker: int = 0
    worker_cpu_millicores: int = 0
    worker_memory_mib: int = 0
    criu: bool = True
    worker_secret: str = ""


class BadRequest(ValueError):
    pass


@dataclass(frozen=True)
class Start:
    worker_id: str
    pool: AgentPool
    settings: SimpleNamespace
    token: str
    bus: dict[str, str]


def read_start(body: dict[str, Any], namespace: str, gateway_url: str) -> Start:
    """A start request, checked and narrowed (BadRequest says what is wrong). Pure."""
    try:
        worker_id = check_id(str(body.get("worker_id", "")), "worker id")
    except InvalidName as e:
        raise BadRequest(str(e)) from None
    shape = body.get("pool") or {}
    known = {f.name for f in fields(AgentPool)} - {"namespace"}
    try:
        pool = AgentPool(namespace=namespace, **{k: v for k, v in shape.items() if k in known})
    except TypeError as e:
        raise BadRequest(f"pool: {e}") from None
    files = body.get("files") or {}
    token = files.get("token")
    if not isinstance(token, str) or not token:
        raise BadRequest("the worker's token is missing")
    bus = {k: str(files[k]) for k in BUS_FILES if isinstance(files.get(k), str)}
    return Start(worker_id, pool, settings_for(body.get("env") or {}, gateway_url), token, bus)


def settings_for(env: dict[str, Any], gateway_url: str) -> SimpleNamespace:
    """The allow-listed settings of a start request (LEVERS9_* names), loopback URLs rewritten."""
    host = urlsplit(gateway_url).hostname or ""
    values = {}
    for name in M.WORKER_SETTINGS:
        value = env.get(f"LEVERS9_{name.upper()}", "")
        if name in URL_SETTINGS and host and host not in LOOPBACK:
            value = rewrite_url(str(value), host)
        values[name] = value
    return SimpleNamespace(**values)


class Pods:
    """The agent's calls on its cluster's API (official client; in-cluster or a kubeconfig)."""

    def __init__(self, api: Any, namespace: str, timeout: float = 10.0) -> None:
        self.api, self.namespace, self.timeout = api, namespace, timeout
        self.known: set[str] = set()  # workers started here whose pods have not ended

    def start(self, s: Start) -> str:
        """Create the worker's Secret, then its Pod; what failed ("" when both were created)."""
        problems = M.pool_problems(s.pool)
        if problems:
            return "; ".join(problems)
        name = M.object_name(s.worker_id)
        try:
            self.api.create_namespaced_secret(self.namespace, cast(Any, M.secret_manifest(
                s.pool, s.worker_id, s.token, s.bus)), _request_timeout=self.timeout)
        except Exception as e:  # noqa: BLE001 - any API failure is told to the platform, never raised
            return _describe(e, f"creating secret {self.namespace}/{name}")
        try:
            self.api.create_namespaced_pod(self.namespace, cast(Any, M.pod_manifest(
                s.pool, s.worker_id, s.settings, sorted(s.bus))), _request_timeout=self.timeout)
        except Exception as e:  # noqa: BLE001
            self._delete(name, pod=False)  # its token must not outlive the attempt
            return _describe(e, f"creating pod {self.namespace}/{name}")
        self.known.add(s.worker_id)
        return ""

    def stop(self, worker_id: str) -> None:
        self.known.discard(worker_id)
        self._delete(M.object_name(worker_id))

    def ended(self) -> dict[str, str]:
        """Workers started here whose pods failed, finished or vanished (their objects are deleted)."""
        resp = self.api.list_namespaced_pod(self.namespace, label_selector=M.SELECTOR, _preload_content=False,
                                            _request_timeout=self.timeout)
        gone = M.gone_workers(set(self.known), json.loads(resp.data).get("items") or [])
        for worker_id in gone:
            self.stop(worker_id)
        return gone

    def _delete(self, name: str, pod: bool = True) -> None:
        calls = [self.api.delete_namespaced_pod] if pod else []
        for call in [*calls, self.api.delete_namespaced_secret]:
            try:
                call(name, self.namespace, _request_timeout=self.timeout)
            except Exception as e:  # noqa: BLE001 - gone already, or the next stop tries again
                if getattr(e, "status", 0) != 404:
                    log.warning("%s", _describe(e, f"deleting {name}"))


def _describe(error: BaseException, action: str) -> str:
    status = getattr(error, "status", None)
    if status:
        body = getattr(error, "body", "") or ""
        try:
            body = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            pass
        return f"{action}: HTTP {status} {getattr(error, 'reason', '')}: {str(body)[:300]}"
    return f"{action}: {type(error).__name__}: {str(error)[:300]}"


def load_api(kubeconfig: str = "") -> Any:
    """The cluster's CoreV1Api: in a pod its ServiceAccount, else the kubeconfig."""
    from kubernetes import client, config

    if not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.CoreV1Api(client.ApiClient(cfg))
    return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig or os.environ.get("KUBECONFIG")))
