"""What the Kubernetes pool backend sends: the pure manifest code now lives in
levers9.runtime.k8s_manifests (an attached cluster's agent builds the very same worker pods), and is
re-exported here for the backend and its tests."""

from __future__ import annotations

from levers9.runtime.k8s_manifests import (
    _LABEL_KEY,
    _LABEL_VALUE,
    ANNOTATION_POOL,
    ANNOTATION_WORKER,
    GPU_RESOURCE,
    GRACE_S,
    HOME,
    HTTP_PORT,
    IMAGE_CACHE,
    LABEL_MANAGED,
    LABEL_POOL,
    LABEL_WORKER,
    MANAGED_BY,
    POOL_SECRET_KEYS,
    SECRET_DIR,
    SELECTOR,
    WORKER_SETTINGS,
    gone_workers,
    label_value,
    labels,
    object_name,
    pod_env,
    pod_gone,
    pod_manifest,
    pod_worker,
    pool_problems,
    secret_manifest,
    worker_env,
)

__all__ = ["ANNOTATION_POOL", "ANNOTATION_WORKER", "GPU_RESOURCE", "GRACE_S", "HOME", "HTTP_PORT", "IMAGE_CACHE",
           "LABEL_MANAGED", "LABEL_POOL", "LABEL_WORKER", "MANAGED_BY", "POOL_SECRET_KEYS", "SECRET_DIR", "SELECTOR",
           "WORKER_SETTINGS", "_LABEL_KEY", "_LABEL_VALUE", "gone_workers", "label_value", "labels", "object_name", "pod_env", "pod_gone",
           "pod_manifest", "pod_worker", "pool_problems", "secret_manifest", "worker_env"]
