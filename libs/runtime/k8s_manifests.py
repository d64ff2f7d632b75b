"""What a worker pod is, as pure functions of the pool, the worker and the settings: the worker's
Secret, its Pod, its environment, and how a pod seen in a list or a watch event tells that its
worker is gone. No I/O here. Two callers: the Kubernetes pool backend (levers9.pool_controller.
backends_k8s, which re-exports these from backends_k8s_manifests) and an attached cluster's agent
(levers9.agent), so a worker pod is the same wherever it runs.

A worker pod gets (README "Kubernetes pools"):
- privileged (runc, CRIU, mounts, cgroups), no service-account token (it never calls the API);
- a node selector `<pool.gpu_label>: <pool.gpu_type>` for a GPU pool, a toleration of the usual
  `nvidia.com/gpu` taint, and `nvidia.com/gpu: gpus_per_worker` limits when the pool's gpu_limits;
- the node's cache directories from the host (hostPath): the image cache, shared by the workers of a
  node, and the levers9 home (per-worker state lives under home/workers/<id>);
- its own Secret: its token and its own NATS user (minted for it alone), the workers' event-signing
  key and the signers' public keys;
- an environment built from an allow-list of the controller's settings (WORKER_SETTINGS): servers'
  addresses and tunables, never a credential. The credentials a worker does need (its database role,
  S3 keys) come from the pool's own Secret (`pool.worker_secret`), which the platform team creates
  with keys scoped to that pool: the controller never copies its own.
"""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any, Protocol

from levers9.runtime.config import Settings, format_setting


class PoolConfig(Protocol):
    """What a pod reads of its pool (levers9.pool_controller.pools.PoolConfig, or the agent's copy)."""
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def image(self) -> str: ...
    @property
    def gpu_type(self) -> str: ...
    @property
    def gpu_label(self) -> str: ...
    @property
    def gpu_limits(self) -> bool: ...
    @property
    def gpus_per_worker(self) -> int: ...
    @property
    def worker_cpu_millicores(self) -> int: ...
    @property
    def worker_memory_mib(self) -> int: ...
    @property
    def criu(self) -> bool: ...
    @property
    def worker_secret(self) -> str: ...

MANAGED_BY = "levers9-pool-controller"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
LABEL_POOL = "levers9.io/pool"
LABEL_WORKER = "levers9.io/worker"
ANNOTATION_WORKER = "levers9.io/worker-id"  # the exact id; labels hold a sanitized form
ANNOTATION_POOL = "levers9.io/pool"
SELECTOR = f"{LABEL_MANAGED}={MANAGED_BY}"
GPU_RESOURCE = "nvidia.com/gpu"

HOME = "/var/lib/levers9"  # the DaemonSet worker (k8s/worker.yaml) uses the same host paths
IMAGE_CACHE = "/var/cache/levers9"
SECRET_DIR = "/etc/levers9/worker"
HTTP_PORT = 8080
GRACE_S = 60  # the worker stops its containers and leaves on SIGTERM

# Settings a worker pod may inherit from the controller: addresses and tunables only. A setting not
# named here is never passed on (database_url, s3 keys, secret_key*, nats_issuer, nats_creds,
# bus_signing_key, token, worker_token, TLS keys ...): adding a field to Settings cannot leak it.
WORKER_SETTINGS = (
    "nats_url", "nats_auth", "s3_endpoint", "s3_region", "registry", "gateway_url", "volumes_bucket",
    "log_level", "log_format", "otel_exporter", "runtime", "bridge_name", "bridge_subnet",
    "container_peers", "container_egress", "cache_port", "cache_max_bytes", "relay_port",
    "sandbox_python", "session_idle_seconds", "worker_shared_checkpoints", "max_body_bytes",
    "max_deliver", "fetch_batch",
)
# Keys of the pool's Secret (pool.worker_secret) and the settings they become; nothing else is read.
POOL_SECRET_KEYS = {"database_url": "LEVERS9_DATABASE_URL", "s3_access_key": "LEVERS9_S3_ACCESS_KEY",
                    "s3_secret_key": "LEVERS9_S3_SECRET_KEY"}

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def object_name(worker_id: str) -> str:
    """The pod's and the secret's name: a DNS label (<= 63), unique per exact worker id (the hash)."""
    clean = re.sub(r"[^a-z0-9-]+", "-", worker_id.lower()).strip("-")[:40].strip("-")
    digest = hashlib.sha256(worker_id.encode()).hexdigest()[:10]
    return f"levers9-w-{clean}-{digest}" if clean else f"levers9-w-{digest}"


def label_value(text: str) -> str:
    """A valid label value (<= 63 chars of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", clean)


def pool_problems(pool: PoolConfig) -> list[str]:
    """Why this pool's pods could not be created as configured (empty: they can)."""
    problems = []
    if not pool.worker_secret:
        problems.append(f"pool {pool.name!r}: backend 'kubernetes' needs worker_secret, the Secret in "
                        f"namespace {pool.namespace!r} with the pool's scoped database_url and S3 keys")
    if pool.gpu_type and not (_LABEL_VALUE.match(pool.gpu_type) and len(pool.gpu_type) <= 63):
        problems.append(f"pool {pool.name!r}: gpu_type {pool.gpu_type!r} is not a valid node label value")
    if not _LABEL_KEY.match(pool.gpu_label):
        problems.append(f"pool {pool.name!r}: gpu_label {pool.gpu_label!r} is not a valid label key")
    return problems


def labels(pool: PoolConfig, worker_id: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "worker", "app.kubernetes.io/part-of": "levers9", LABEL_MANAGED: MANAGED_BY,
            LABEL_POOL: label_value(pool.name) or "pool", LABEL_WORKER: label_value(worker_id) or "worker"}


def _metadata(pool: PoolConfig, worker_id: str) -> dict[str, Any]:
    return {"name": object_name(worker_id), "namespace": pool.namespace, "labels": labels(pool, worker_id),
            "annotations": {ANNOTATION_WORKER: worker_id, ANNOTATION_POOL: pool.name}}


def secret_manifest(pool: PoolConfig, worker_id: str, token: str, bus: dict[str, str]) -> dict[str, Any]:
    """The worker's own Secret: its token and `bus` (nats.creds, worker.sign, signers.json when NATS
    runs with auth), base64-encoded as the API stores them."""
    files = {"token": token, **bus}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _metadata(pool, worker_id), "type": "Opaque",
            "immutable": True, "data": {k: base64.b64encode(v.encode()).decode() for k, v in files.items()}}


def worker_env(settings: Settings | Any) -> dict[str, str]:
    """The allow-listed settings, as LEVERS9_* variables (empty ones left out: the default applies)."""
    out = {}
    for name in WORKER_SETTINGS:
        value = settings.get(name) if isinstance(settings, Settings) else getattr(settings, name)
        if value not in ("", None):
            out[f"LEVERS9_{name.upper()}"] = format_setting(value)
    return out


def pod_env(pool: PoolConfig, worker_id: str, settings: Settings | Any, bus_keys: list[str]) -> list[dict[str, Any]]:
    """The container's env: the allow-list, the worker's identity and capacity, files of its own Secret,
    and secretKeyRefs into the pool's Secret (values never pass through the controller)."""
    fixed = {**worker_env(settings), "LEVERS9_SERVICE": "worker", "LEVERS9_WORKER_ID": worker_id,
             "LEVERS9_WORKER_POOL": pool.name, "LEVERS9_HTTP_HOST": "0.0.0.0", "LEVERS9_HTTP_PORT": str(HTTP_PORT),
             "LEVERS9_HOME": HOME, "LEVERS9_IMAGE_CACHE": IMAGE_CACHE,
             "LEVERS9_WORKER_CPU_MILLICORES": str(pool.worker_cpu_millicores),
             "LEVERS9_WORKER_MEMORY_MIB": str(pool.worker_memory_mib),
             "LEVERS9_WORKER_CRIU": "auto" if pool.criu else "off", "LEVERS9_WORKER_GPU_TYPE": pool.gpu_type,
             "LEVERS9_WORKER_GPU_COUNT": str(pool.gpus_per_worker)}
    files = {"nats.creds": "LEVERS9_NATS_CREDS", "worker.sign": "LEVERS9_BUS_SIGNING_KEY",
             "signers.json": "LEVERS9_BUS_SIGNERS"}
    fixed.update({var: f"{SECRET_DIR}/{key}" for key, var in files.items() if key in bus_keys})
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in fixed.items()]
    env.append({"name": "LEVERS9_WORKER_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": object_name(worker_id), "key": "token"}}})
    if pool.worker_secret:
        env += [{"name": var, "valueFrom": {"secretKeyRef": {"name": pool.worker_secret, "key": key,
                                                            "optional": key != "database_url"}}}
                for key, var in POOL_SECRET_KEYS.items()]
    return env


def _resources(pool: PoolConfig) -> dict[str, Any]:
    # requests only for cpu/memory: the worker runs user containers in cgroups of its own, which a
    # pod limit would squeeze; GPUs are requested as limits, which is how the device plugin counts them
    requests = {}
    if pool.worker_cpu_millicores:
        requests["cpu"] = f"{pool.worker_cpu_millicores}m"
    if pool.worker_memory_mib:
        requests["memory"] = f"{pool.worker_memory_mib}Mi"
    out: dict[str, Any] = {"requests": requests} if requests else {}
    if pool.gpu_limits and pool.gpus_per_worker > 0:
        out["limits"] = {GPU_RESOURCE: str(pool.gpus_per_worker)}
    return out


def _placement(pool: PoolConfig) -> dict[str, Any]:
    if not pool.gpu_type:
        return {}
    return {"nodeSelector": {pool.gpu_label: pool.gpu_type},
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]}


def pod_manifest(pool: PoolConfig, worker_id: str, settings: Settings | Any, bus_keys: list[str]) -> dict[str, Any]:
    """The worker's Pod. `bus_keys`: which bus files its Secret holds (none when NATS has no auth)."""
    container = {
        "name": "worker", "image": pool.image, "imagePullPolicy": "IfNotPresent", "args": ["service", "worker"],
        "env": pod_env(pool, worker_id, settings, bus_keys), "securityContext": {"privileged": True},
        "ports": [{"name": "http", "containerPort": HTTP_PORT}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": HTTP_PORT}, "periodSeconds": 5},
        "resources": _resources(pool),
        "volumeMounts": [{"name": "home", "mountPath": HOME}, {"name": "image-cache", "mountPath": IMAGE_CACHE},
                         {"name": "worker-secret", "mountPath": SECRET_DIR, "readOnly": True}]}
    spec = {"restartPolicy": "Never",  # a worker that dies is lost, and the controller starts another
            "automountServiceAccountToken": False, "enableServiceLinks": False,
            "terminationGracePeriodSeconds": GRACE_S, **_placement(pool), "containers": [container],
            "volumes": [{"name": "home", "hostPath": {"path": HOME, "type": "DirectoryOrCreate"}},
                        {"name": "image-cache", "hostPath": {"path": IMAGE_CACHE, "type": "DirectoryOrCreate"}},
                        {"name": "worker-secret", "secret": {"secretName": object_name(worker_id),
                                                             "defaultMode": 0o400}}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _metadata(pool, worker_id), "spec": spec}


def pod_worker(pod: dict[str, Any]) -> str:
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_WORKER, "")


def pod_gone(pod: dict[str, Any], event: str = "") -> str:
    """Why the worker of this pod (from a list, or a watch event of type `event`) is gone; "" if not."""
    if event == "DELETED" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "its pod was deleted"
    status = pod.get("status") or {}
    phase = status.get("phase", "")
    if phase not in ("Failed", "Succeeded"):
        return ""
    why = f"its pod {phase.lower()}"
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        if term:
            why += f" (exit code {term.get('exitCode')}{', ' + term['reason'] if term.get('reason') else ''})"
    if status.get("reason"):
        why += f": {status['reason']}"
    return why


def gone_workers(known: set[str], pods: list[dict[str, Any]]) -> dict[str, str]:
    """From a full list of the managed pods: which of the `known` workers are gone, and why (a known
    worker with no pod at all was deleted behind our back)."""
    seen = {pod_worker(p): p for p in pods if pod_worker(p)}
    out = {}
    for wid in known:
        pod = seen.get(wid)
        why = pod_gone(pod) if pod is not None else "its pod disappeared"
        if why:
            out[wid] = why
    return out
