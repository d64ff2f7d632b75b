"""Who may do what on the bus: the permission tables of every NATS user, and which service owns
each event that grants or moves power. Pure data and functions; nats_jwt.py turns them into JWTs.

Subjects are `levers9.<workspace>.<aggregate>.<id>.<EventType>`, so the server can refuse an event
type by its last token (`levers9.*.*.*.TokenCreated`) and a workspace by its second.

Roles:
- admin: the CLI on the host that ran `levers9 up` (it holds the home anyway): everything.
- a service (gateway, scheduler, pool-controller, checkpoint-store, image-builder): any event subject
  except power events it does not own; JetStream reads and consumers; creating (never deleting,
  purging or updating) the platform's streams.
- a worker: its own worker aggregate, the container/checkpoint/image/deployment event types a
  worker reports, its own heartbeat key; consumers and reads. Container ids are not known when a
  worker is provisioned, so the server lets it publish a report on any container; the consumers
  bind each report to its sender instead (signed with the worker's own user key, bus_signing.py)
  and apply it only from the worker the container is placed on (views.foreign_report). It can
  never schedule, reserve or register anything but itself.
- a publisher of workspace W (`levers9 publishers create`): only OUTSIDE_TYPES under `levers9.W.`,
  and one audit consumer of its own, filtered to `levers9.W.>`.

Every user gets its own inbox prefix (`_INBOX_<tag>`) and may subscribe only there, so no user
reads the replies (fetched events, KV values) meant for another.
"""

from __future__ import annotations

from typing import Any

from levers9.contracts import subjects
from levers9.contracts.ids import SYSTEM_WORKSPACE, check_id, check_workspace

ROLES_SERVICES = ("gateway", "scheduler", "pool-controller", "checkpoint-store", "image-builder")
ADMIN = "admin"
WORKER = "worker"
PUBLISHER = "publisher"

# Events that grant or move power, and the roles whose signature makes them valid. The admin (the
# operator's CLI) may sign every one of them; nobody else outside this table may.
POWER_OWNERS: dict[str, frozenset[str]] = {
    "TokenCreated": frozenset({"gateway", "pool-controller"}),  # pool-controller: a worker's own token
    "TokenRevoked": frozenset({"gateway"}),
    "SecretSet": frozenset({"gateway"}),
    "SecretDeleted": frozenset({"gateway"}),
    "WorkerProvisioned": frozenset({"pool-controller"}),
    "WorkerLost": frozenset({"pool-controller"}),
    "WorkerDrained": frozenset({"pool-controller"}),
    # a lost worker's containers are placed again on it: its reaper (the pool controller's) or its
    # own next run says nothing of the dead run is left (events/worker.py)
    "WorkerFenced": frozenset({"pool-controller", WORKER}),
    "WorkerRegistered": frozenset({WORKER}),
    "WorkerReady": frozenset({WORKER}),
    "WorkerCordoned": frozenset({"gateway"}),
    "WorkerUncordoned": frozenset({"gateway"}),
    "WorkerSlotReserved": frozenset({"scheduler"}),
    "WorkerSlotReleased": frozenset({"scheduler"}),
    "ContainerScheduled": frozenset({"scheduler"}),
    "PlacementDeferred": frozenset({"scheduler"}),
    # attached clusters (events/cluster.py): who may run work on a workspace's cluster
    "ClusterAttached": frozenset({"gateway"}),
    "ClusterShared": frozenset({"gateway"}),
    "ClusterDetached": frozenset({"gateway"}),
}

# What another system may publish into its workspace: requests, which the platform's services then
# decide on. Everything else (facts a service observed, power events) comes from the services.
OUTSIDE_TYPES: tuple[str, ...] = (
    "DeploymentCreated", "DeploymentStopped", "DeploymentDeleted",
    "ContainerRequested", "ContainerStopRequested", "ContainerCheckpointRequested",
    "ImageBuildRequested", "ImageDeleted", "CheckpointDeleted",
)

# What a worker reports, by aggregate (its own worker aggregate is allowed whole, less power events
# it does not own).
WORKER_TYPES: dict[str, tuple[str, ...]] = {
    "container": ("ContainerStarted", "ContainerReady", "ContainerStopped", "ContainerFailed"),
    "deployment": ("DeploymentCheckpointClaimed",),
    "checkpoint": ("CheckpointDumped", "CheckpointFailed"),
    "image": ("ImageBuildStarted", "ImageBuildProgress", "ImagePushed", "ImageBuildFailed"),
}

HEARTBEAT_BUCKET = "levers9_heartbeats"
# Core NATS request/reply (never the log: a start carries the worker's token and NATS user) from the
# pool controller to the gateway, which relays it to the cluster's agent (levers9rpc.cluster.<name>.<op>).
CLUSTER_RPC = "levers9rpc.cluster"
# what each service may do on it besides the log: the pool controller asks, the gateway answers (into
# the pool controller's own inbox: the JWTs carry no response permission)
_RPC_PUB = {"pool-controller": [f"{CLUSTER_RPC}.>"], "gateway": ["_INBOX_pool-controller.>"]}
_RPC_SUB = {"gateway": [f"{CLUSTER_RPC}.>"]}
# Core NATS, never the log: each gateway's load sample every second (levers9.gateway.load_report), read
# by the scheduler's autoscaler; levers9load.<gateway id>
LOAD_SUBJECT = "levers9load"
_LOAD_PUB = {"gateway": [f"{LOAD_SUBJECT}.>"]}
_LOAD_SUB = {"scheduler": [f"{LOAD_SUBJECT}.>"]}
STREAMS = (subjects.STREAM, subjects.DLQ_STREAM, f"KV_{HEARTBEAT_BUCKET}")

# Reading and consuming: every role but a publisher.
_JS_READ = ["$JS.API.INFO", "$JS.API.STREAM.INFO.*", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.MSG.GET.*",
            "$JS.API.DIRECT.GET.>", "$JS.API.CONSUMER.>", "$JS.ACK.>", "$JS.FC.>",
            f"{subjects.DLQ_ROOT}.>"]
_JS_TOPOLOGY = [f"$JS.API.STREAM.CREATE.{s}" for s in STREAMS]


def owns(role: str, event_type: str) -> bool:
    """May `role` sign (and publish) `event_type`? Non-power events: anyone the subject allows."""
    owners = POWER_OWNERS.get(event_type)
    return owners is None or role == ADMIN or role in owners


def inbox_prefix(tag: str) -> str:
    return f"_INBOX_{tag}"


def type_subject(event_type: str, workspace: str = "*", aggregate: str = "*", aggregate_id: str = "*") -> str:
    return f"{subjects.ROOT}.{workspace}.{aggregate}.{aggregate_id}.{event_type}"


def _not_owned(role: str) -> list[str]:
    return [type_subject(t) for t in sorted(POWER_OWNERS) if not owns(role, t)]


def _perms(pub_allow: list[str], tag: str, pub_deny: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    pub: dict[str, Any] = {"allow": pub_allow}
    if pub_deny:
        pub["deny"] = list(pub_deny)
    return {"pub": pub, "sub": {"allow": [f"{inbox_prefix(tag)}.>"]}}


def service_permissions(service: str) -> dict[str, Any]:
    if service not in ROLES_SERVICES:
        raise ValueError(f"unknown service {service!r}; known: {', '.join(ROLES_SERVICES)}")
    perms = _perms([f"{subjects.ROOT}.>", *_JS_READ, *_JS_TOPOLOGY, *_RPC_PUB.get(service, []),
                    *_LOAD_PUB.get(service, [])], service, _not_owned(service))
    perms["sub"]["allow"] += _RPC_SUB.get(service, []) + _LOAD_SUB.get(service, [])
    return perms


def worker_tag(worker_id: str) -> str:
    return f"w_{worker_id}"


def worker_permissions(worker_id: str) -> dict[str, Any]:
    check_id(worker_id, "worker id")
    own = f"{subjects.ROOT}.{SYSTEM_WORKSPACE}.worker.{worker_id}.>"
    reports = [type_subject(t, aggregate=agg) for agg, types in WORKER_TYPES.items() for t in types]
    return _perms([own, *reports, *_JS_READ, f"$KV.{HEARTBEAT_BUCKET}.{worker_id}"], worker_tag(worker_id),
                  _not_owned(WORKER))


def publisher_tag(workspace: str, publisher_id: str) -> str:
    return f"p_{workspace}_{publisher_id}"


def audit_consumer(workspace: str, publisher_id: str) -> str:
    """The one consumer a publisher may create: its name is fixed, its filter its workspace."""
    return f"audit_{publisher_tag(workspace, publisher_id)}"


def publisher_permissions(workspace: str, publisher_id: str) -> dict[str, Any]:
    check_workspace(workspace)
    check_id(publisher_id, "publisher id")
    name, s = audit_consumer(workspace, publisher_id), subjects.STREAM
    audit = [f"$JS.API.CONSUMER.CREATE.{s}.{name}.{subjects.ROOT}.{workspace}.>",
             f"$JS.API.CONSUMER.INFO.{s}.{name}", f"$JS.API.CONSUMER.DELETE.{s}.{name}",
             f"$JS.API.CONSUMER.MSG.NEXT.{s}.{name}", f"$JS.ACK.{s}.{name}.>"]
    return _perms([type_subject(t, workspace) for t in OUTSIDE_TYPES] + audit,
                  publisher_tag(workspace, publisher_id))


def admin_permissions() -> dict[str, Any]:
    return {"pub": {"allow": [">"]}, "sub": {"allow": [">"]}}


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` one token, `>` one or more trailing tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


def may_publish(perms: dict[str, Any], subject: str) -> bool:
    """What the server decides for a publish: allowed by some allow and by no deny."""
    pub = perms.get("pub", {})
    return (any(matches(p, subject) for p in pub.get("allow", []))
            and not any(matches(p, subject) for p in pub.get("deny", [])))
