"""Events of attached clusters: a workspace's own Kubernetes cluster whose agent runs levers9 workers.

Subjects are `levers9.<owner workspace>.cluster.<name>.<EventType>`: the attaching workspace owns the
cluster (an audit of that workspace shows its clusters and whom they were shared with). A cluster's
name is its workspace's: two workspaces may each attach a `gpu`. On the platform a cluster is known by
its reference `WORKSPACE/NAME` (`cluster_ref`), which is what a pool names (`cluster =
"acme/gpu"`), what the scheduler and the views key on, and what the gateway relays requests for;
the events keep the short name (the owner is the envelope's workspace), so logs written when names
were platform-wide replay unchanged.

All three are power events (levers9.runtime.nats_auth.POWER_OWNERS): who may run work on a cluster
is decided by them, so only the gateway (or the admin) signs them.
"""

from __future__ import annotations

from .base import Event


def cluster_ref(workspace: str, name: str) -> str:
    """A cluster's platform-wide reference: its owner's workspace and its name."""
    return f"{workspace}/{name}"


class ClusterAttached(Event, frozen=True, kw_only=True):
    """The owner workspace attached cluster `name`; `token_id` is its agent's join token (scope
    `cluster:<name>`, a TokenCreated of the same workspace appended just before)."""
    AGGREGATE = "cluster"
    ID_FIELD = "name"
    name: str
    token_id: str = ""


class ClusterShared(Event, frozen=True, kw_only=True):
    """Workspace `workspace` may run its work on the cluster too (appended by the owner's admin)."""
    AGGREGATE = "cluster"
    ID_FIELD = "name"
    name: str
    workspace: str


class ClusterDetached(Event, frozen=True, kw_only=True):
    """The cluster takes no more work; its join token is revoked (a TokenRevoked beside this)."""
    AGGREGATE = "cluster"
    ID_FIELD = "name"
    name: str
