"""Events of attached clusters: a workspace's own Kubernetes cluster whose agent runs levers9 workers.

Subjects are `levers9.<owner workspace>.cluster.<name>.<EventType>`: the attaching workspace owns the
cluster (an audit of that workspace shows its clusters and whom they were shared with). A cluster's
name is unique on the platform (the gateway refuses a second attach of a name), because a pool names
its cluster (`cluster = "NAME"` in the pools file) without a workspace.

All three are power events (levers9.runtime.nats_auth.POWER_OWNERS): who may run work on a cluster
is decided by them, so only the gateway (or the admin) signs them.
"""

from __future__ import annotations

from .events import Event


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
