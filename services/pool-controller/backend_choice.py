"""Which backend a pool's workers come from: `make_backend(kind, ...)`.

Its own module because it imports every backend while they all build on backends.py. The
Kubernetes client is heavy and needed only by kubernetes pools: that backend is imported when one
is made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from levers9.runtime.config import Settings

from .backends import Backend, LocalBackend
from .backends_cluster import ClusterBackend
from .backends_netns import NetnsBackend


def make_backend(kind: str, home: Path, issuer: str = "", bus: Callable[[], Any] | None = None) -> Backend:
    if kind == "local":
        return LocalBackend(home, issuer)
    if kind == "netns":  # each worker its own host: a network namespace on an underlay bridge
        return NetnsBackend(home, issuer)
    if kind == "kubernetes":  # worker pods; the kubernetes client is imported only for such pools
        from .backends_k8s import KubernetesBackend

        return KubernetesBackend(Settings.load(), issuer)
    if kind == "cluster" and bus is not None:  # pods on an attached cluster, through its agent's gateway
        return ClusterBackend(Settings.load(), issuer, bus)
    raise SystemExit(f"pool backend {kind!r} is not available here (known: 'local', 'netns', 'kubernetes', 'cluster')")
