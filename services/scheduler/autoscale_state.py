"""What the autoscaler knows besides the scheduler's memory of containers: the deployments it governs
(their spec, scaling after DeploymentScaled, stored checkpoints), when each container became ready,
how many containers it has ever requested per deployment, and the load the gateways report.

Folded from an ordered replay of the log from sequence 1 at every start (deployment and checkpoint
events, container requests, readiness and ends), so every replica that has read as far holds the
same values: the container ids the autoscaler requests are derived from the count of its earlier
requests (`autoscaled_id`), which is what makes two replicas collide on the same id instead of
starting two containers (the append expects no event on that container yet).
The load is not in the log: each gateway publishes a sample every second (levers9.gateway.load_report);
the latest of each gateway is kept for LOAD_TTL_S.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field, replace

import msgspec

from levers9.contracts import Message
from levers9.contracts import events as E
from levers9.contracts.autoscaling import Load, crash_backoff_s, governed, rescale, superseded, tasks_per_container
from levers9.contracts.spec import CheckpointRef, DeploymentSpec, Scaling
from levers9.contracts.task_state import QueueDepth

REASON_PREFIX = "autoscaler: "
ID_NAMESPACE = uuid.UUID("0b6f3a52-7c1e-4c59-9a7e-2d4b8e1f6a30")
LOAD_TTL_S = 5.0
Key = tuple[str, str]  # (workspace, deployment_id) or (workspace, container_id)


def autoscaled_id(workspace: str, deployment_id: str, n: int) -> str:
    """The id of the autoscaler's n-th container of a deployment: the same in every replica."""
    return str(uuid.uuid5(ID_NAMESPACE, f"{workspace}/{deployment_id}/{n}"))


def occurred(msg: Message) -> float:
    return dt.datetime.fromisoformat(msg.envelope.occurred_at.replace("Z", "+00:00")).timestamp()


@dataclass
class Governed:
    workspace: str
    deployment_id: str
    name: str
    version: int
    spec: DeploymentSpec
    scaling: Scaling
    active: bool = True
    checkpoints: list[CheckpointRef] = field(default_factory=list)  # stored ones, newest first
    requested: int = 0  # the autoscaler's requests seen in the log (the next id's index)
    superseded: bool = False  # a newer version of the name was deployed: nothing kept warm for this one
    failures: int = 0  # its containers that failed in a row before they were ready
    failed_at: float = 0.0  # when the last of them failed (the event's time: the same in every replica)

    @property
    def policy(self) -> Scaling:
        return superseded(self.scaling) if self.superseded else self.scaling

    @property
    def held_until(self) -> float:
        """No start before this (unix seconds): the crash back-off after failed starts."""
        return self.failed_at + crash_backoff_s(self.failures) if self.failures else 0.0


@dataclass
class Fleet:
    deployments: dict[Key, Governed] = field(default_factory=dict)
    ready_at: dict[Key, float] = field(default_factory=dict)
    dumped: dict[str, tuple[Key, int, E.CheckpointDumped]] = field(default_factory=dict)  # id -> not stored yet
    stored: dict[str, Key] = field(default_factory=dict)  # checkpoint id -> its deployment
    samples: dict[str, tuple[float, dict]] = field(default_factory=dict)  # gateway -> (received, its sample)
    queues: dict[str, QueueDepth] = field(default_factory=dict)  # workspace -> its task queues' depth
    owner: dict[Key, Key] = field(default_factory=dict)  # a live container of a governed deployment -> it

    def fold(self, msg: Message) -> None:
        ev, ws = msg.event, msg.envelope.workspace
        if ev.AGGREGATE == "deployment":
            self._deployment(ws, ev)
        elif ev.AGGREGATE == "checkpoint":
            self._checkpoint(ws, ev)
        elif ev.AGGREGATE == "task":
            self.queues.setdefault(ws, QueueDepth()).apply(ev)
        elif isinstance(ev, E.ContainerRequested):
            self._requested(ws, ev)
        elif isinstance(ev, E.ContainerReady):
            self.ready_at[(ws, ev.container_id)] = occurred(msg)
            dep = self.deployments.get(self.owner.get((ws, ev.container_id), ("", "")))
            if dep is not None:
                dep.failures = 0
        elif isinstance(ev, (E.ContainerStopped, E.ContainerFailed)):
            self._ended(ws, ev, msg)

    def live_by_deployment(self) -> dict[Key, list[Key]]:
        """Each governed deployment's containers that the replay saw requested and not ended."""
        live: dict[Key, list[Key]] = {}
        for container, dep in self.owner.items():
            live.setdefault(dep, []).append(container)
        return live

    def _requested(self, ws: str, ev: E.ContainerRequested) -> None:
        dep = self.deployments.get((ws, ev.deployment_id))
        if dep is None:
            return
        if ev.reason.startswith(REASON_PREFIX):
            dep.requested += 1
        if not ev.session_id:
            self.owner[(ws, ev.container_id)] = (ws, ev.deployment_id)

    def _ended(self, ws: str, ev: E.ContainerStopped | E.ContainerFailed, msg: Message) -> None:
        """A container that failed before it was ready counts toward the crash back-off."""
        key = (ws, ev.container_id)
        was_ready = self.ready_at.pop(key, None) is not None
        dep = self.deployments.get(self.owner.pop(key, ("", "")))
        if dep is not None and isinstance(ev, E.ContainerFailed) and not was_ready:
            dep.failures += 1
            dep.failed_at = occurred(msg)

    def _deployment(self, ws: str, ev: E.Event) -> None:
        key = (ws, ev.aggregate_id)
        if isinstance(ev, E.DeploymentCreated):
            if governed(ev.spec):
                self.deployments[key] = Governed(ws, ev.deployment_id, ev.name, ev.version, ev.spec, ev.spec.scaling)
            for other in self.deployments.values():
                if other.workspace == ws and other.name == ev.name and other.version < ev.version:
                    other.superseded = True
            return
        dep = self.deployments.get(key)
        if dep is None:
            return
        if isinstance(ev, (E.DeploymentStopped, E.DeploymentDeleted)):
            dep.active = False
        elif isinstance(ev, E.DeploymentScaled):
            try:
                dep.scaling = rescale(dep.scaling, min_containers=ev.min_containers, max_containers=ev.max_containers,
                                      buffer_containers=ev.buffer_containers,
                                      target_concurrency=ev.target_concurrency)
            except ValueError:
                pass  # the gateway refuses these; one published from elsewhere changes nothing

    def _checkpoint(self, ws: str, ev: E.Event) -> None:
        if isinstance(ev, E.CheckpointDumped):
            key = (ws, ev.deployment_id)
            if key in self.deployments:
                self.dumped[ev.checkpoint_id] = (key, ev.deployment_version, ev)
        elif isinstance(ev, E.CheckpointStored) and ev.checkpoint_id in self.dumped:
            key, version, d = self.dumped.pop(ev.checkpoint_id)
            dep = self.deployments.get(key)
            if dep is not None and version == dep.version:
                ref = CheckpointRef(checkpoint_id=ev.checkpoint_id, accelerator=d.accelerator, sha256=ev.sha256,
                                    size_bytes=ev.size_bytes, bucket=ev.bucket, key=ev.key, location=d.location)
                dep.checkpoints.insert(0, ref)
                self.stored[ev.checkpoint_id] = key
        elif isinstance(ev, (E.CheckpointFailed, E.CheckpointDeleted)):
            self.dumped.pop(ev.checkpoint_id, None)
            owner = self.stored.pop(ev.checkpoint_id, None)
            dep = self.deployments.get(owner) if owner is not None else None
            if dep is not None:
                dep.checkpoints = [c for c in dep.checkpoints if c.checkpoint_id != ev.checkpoint_id]

    # ---- the gateways' load ------------------------------------------------------------------------

    def sampled(self, gateway: str, sample: dict, now: float) -> None:
        self.samples[gateway] = (now, sample)

    def confirmed_at(self, now: float) -> float:
        """Up to when every reporting gateway has told what its containers serve: the oldest of their
        latest samples (its own time, or when it arrived if that is earlier). Idleness after that is
        not known: a call may have come in since."""
        return min((min(at, float(s.get("at", at))) for at, s in self.samples.values()), default=now)

    def fresh(self, now: float) -> list[dict]:
        for gw in [g for g, (at, _) in self.samples.items() if now - at > LOAD_TTL_S]:
            del self.samples[gw]
        return [s for _, s in self.samples.values()]

    def load_of(self, samples: list[dict], dep: Governed) -> tuple[Load, dict[str, tuple[int, float]]]:
        """The deployment's load over the gateways and its task queue, and per container (in
        flight, last used). Tasks a runner took wait or run as calls: only those not started count
        as queued tasks."""
        load, per = calls_of(samples, (dep.workspace, dep.deployment_id))
        per_container = tasks_per_container(dep.spec)
        if per_container:
            queue = self.queues.get(dep.workspace)
            waiting = queue.depth(dep.deployment_id)[0] if queue is not None else 0
            load = replace(load, queued_tasks=waiting, tasks_per_container=per_container)
        return load, per


def calls_of(samples: list[dict], key: Key) -> tuple[Load, dict[str, tuple[int, float]]]:
    """The deployment's calls over the gateways, and per container (in flight, last used)."""
    waiting = inflight = 0
    per: dict[str, tuple[int, float]] = {}
    name = f"{key[0]}/{key[1]}"
    for s in samples:
        d = s.get("deployments", {}).get(name)
        if not d:
            continue
        waiting += int(d.get("waiting", 0))
        for cid, (n, used) in d.get("containers", {}).items():
            was = per.get(cid, (0, 0.0))
            per[cid] = (was[0] + int(n), max(was[1], float(used)))
            inflight += int(n)
    return Load(waiting=waiting, inflight=inflight, known=bool(samples)), per


def scaled_spec(dep: Governed) -> DeploymentSpec:
    """The spec the autoscaler's containers run with: its scaling as changed at run time."""
    return msgspec.structs.replace(dep.spec, scaling=dep.scaling)


__all__ = ["Fleet", "Governed", "autoscaled_id", "scaled_spec", "REASON_PREFIX"]
