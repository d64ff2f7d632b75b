"""The scheduler's autoscaler shell (levers9.scheduler.autoscaler) over a fake log that enforces
expected sequences: min_containers started with its reason, a dead one replaced, two replicas
never starting the same container twice, idle ones stopped after the window, DeploymentScaled applied,
a deployed function scaled as an endpoint while its sessions' sandboxes are neither counted nor stopped."""

from __future__ import annotations

import asyncio

import msgspec

from levers9.contracts import Message, envelope
from levers9.contracts import events as E
from levers9.contracts.envelope import subject_of
from levers9.contracts.spec import Code, DeploymentSpec, Scaling
from levers9.runtime.bus import Appended, ConcurrencyConflict
from levers9.runtime.consumer import Delivery
from levers9.scheduler.autoscale_state import autoscaled_id
from levers9.scheduler.autoscaler import Autoscaler
from levers9.scheduler.memory import Memory


class Log:
    """Appends with the server's rule: the aggregate's last sequence must be the one expected."""

    def __init__(self) -> None:
        self.seq = 0
        self.last: dict[str, int] = {}
        self.events: list[tuple[object, E.Event]] = []

    async def append(self, env, expected: int) -> Appended:
        agg = env.subject.rsplit(".", 1)[0]
        if self.last.get(agg, 0) != expected:
            raise ConcurrencyConflict(env.subject, expected)
        self.seq += 1
        self.last[agg] = self.seq
        return Appended(seq=self.seq, duplicate=False)

    def put(self, ev: E.Event, workspace: str = "acme") -> Message:
        env = envelope(ev, workspace=workspace)
        self.seq += 1
        self.last[env.subject.rsplit(".", 1)[0]] = self.seq
        return Message(env, ev, subject_of(env, ev))


def spec(**scaling) -> DeploymentSpec:
    return DeploymentSpec(name="web", code=Code(module="m", handler="h"), scaling=Scaling(**scaling))


def scaler(log: Log, memory: Memory | None = None, clock=lambda: 1_000_000.0) -> Autoscaler:
    a = Autoscaler(log, memory or Memory(), lambda: None, clock=clock)  # type: ignore[arg-type]
    a.fleet.sampled("g1", {"gateway": "g1", "deployments": {}}, clock())  # a gateway reports: load known
    return a


def deploy(log: Log, *scalers: Autoscaler, **scaling) -> None:
    msg = log.put(E.DeploymentCreated(deployment_id="web-v1", name="web", spec=spec(**scaling)))
    for a in scalers:
        a.fleet.fold(msg)


def requests(memory: Memory) -> list:
    return [c for c in memory.containers.values() if c.status == "requested"]


def test_min_containers_started_once_with_the_reason_and_replaced_when_it_dies():
    log, now = Log(), [1_000_000.0]
    a = scaler(log, clock=lambda: now[0])
    deploy(log, a, min_containers=1, max_containers=2)
    asyncio.run(a.run_pass())
    asyncio.run(a.run_pass())  # level triggered: the request is counted, nothing more
    [c] = requests(a.memory)
    assert c.container_id == autoscaled_id("acme", "web-v1", 0)
    assert c.request.reason.startswith("autoscaler: min_containers=1")
    a.fleet.fold(Message(*_env(c.request)))  # the replay sees the request: the next id's index moves on
    failed = log.put(E.ContainerFailed(container_id=c.container_id, reason="killed"))
    a.memory.apply(failed, log.seq)
    asyncio.run(a.run_pass())
    assert requests(a.memory) == []  # the replay has not folded the failure yet: nothing decided
    asyncio.run(a.apply([Delivery(log.seq, failed.subject, b"", {}, 1, failed)]))
    now[0] = a.fleet.deployments[("acme", "web-v1")].failed_at + 5  # failed before it was ready: the first back-off
    a.fleet.sampled("g1", {"gateway": "g1", "deployments": {}}, now[0])
    asyncio.run(a.run_pass())
    [again] = requests(a.memory)
    assert again.container_id == autoscaled_id("acme", "web-v1", 1)


def test_containers_that_fail_before_ready_back_off_the_next_start_and_a_ready_one_resets_it():
    log, now = Log(), [1_000_000.0]
    a = scaler(log, clock=lambda: now[0])
    deploy(log, a, min_containers=1, max_containers=2)

    def fail_the_request() -> None:
        [c] = requests(a.memory)
        a.fleet.fold(Message(*_env(c.request)))
        failed = log.put(E.ContainerFailed(container_id=c.container_id, reason="ModuleNotFoundError: yaml"))
        a.memory.apply(failed, log.seq)
        asyncio.run(a.apply([Delivery(log.seq, failed.subject, b"", {}, 1, failed)]))

    asyncio.run(a.run_pass())
    fail_the_request()
    dep = a.fleet.deployments[("acme", "web-v1")]
    now[0] = dep.failed_at + 4  # within the first 5 s: nothing started, the failed app is not restarted
    a.fleet.sampled("g1", {"gateway": "g1", "deployments": {}}, now[0])
    asyncio.run(a.run_pass())
    assert requests(a.memory) == [] and ("acme", "web-v1") in a.holding
    now[0] = dep.failed_at + 5
    asyncio.run(a.run_pass())
    fail_the_request()  # the second in a row: 10 s
    assert dep.failures == 2 and dep.held_until == dep.failed_at + 10
    now[0] = dep.failed_at + 10
    asyncio.run(a.run_pass())
    [c] = requests(a.memory)
    a.fleet.fold(Message(*_env(c.request)))
    a.fleet.fold(log.put(E.ContainerReady(container_id=c.container_id, worker_id="w1", address="http://x")))
    assert dep.failures == 0 and dep.held_until == 0


def test_two_replicas_never_start_the_same_container_twice():
    log = Log()
    a, b = scaler(log), scaler(log)
    deploy(log, a, b, min_containers=1, max_containers=3)
    asyncio.run(a.run_pass())
    asyncio.run(b.run_pass())  # b has not seen a's request: it collides on the same id and loses
    assert len(requests(a.memory)) == 1 and requests(b.memory) == []
    assert b.counters["conflicts"] == 1 and a.counters["started"] == 1


def test_a_replica_whose_placer_memory_lags_its_replay_starts_no_third_container():
    """CI (two scheduler processes, min_containers=2): b lost index 0 to a, then its replay folded
    both of a's requests (the next index: 2) while its placer's memory had seen only the first, so
    it saw one live container and started index 2 -- three containers for a minimum of two."""
    log = Log()
    a, b = scaler(log), scaler(log)
    deploy(log, a, b, min_containers=2, max_containers=4)
    asyncio.run(a.run_pass())
    first, second = sorted(requests(a.memory), key=lambda c: c.container_id != autoscaled_id("acme", "web-v1", 0))
    asyncio.run(b.run_pass())  # collides on index 0
    for c in (first, second):
        b.fleet.fold(Message(*_env(c.request)))  # the replay folded both requests ...
    b.memory.apply(Message(*_env(first.request)), log.seq)  # ... the placer's memory only the first
    asyncio.run(b.run_pass())
    assert [c.container_id for c in requests(b.memory)] == [first.container_id], "a third container"
    b.memory.apply(Message(*_env(second.request)), log.seq)  # caught up: two live, nothing to start
    asyncio.run(b.run_pass())
    assert b.counters["started"] == 0


def test_an_idle_container_stops_after_the_window_and_scale_applies_at_once():
    log, now = Log(), [1_000_000.0]
    a = scaler(log, clock=lambda: now[0])
    deploy(log, a, min_containers=1, max_containers=2, scaledown_window=30)
    asyncio.run(a.run_pass())
    [c] = requests(a.memory)
    ready = log.put(E.ContainerReady(container_id=c.container_id, worker_id="w1", address="http://x"))
    a.memory.apply(ready, log.seq)
    a.fleet.ready_at[c.key] = now[0]
    now[0] += 60
    a.fleet.sampled("g1", {"gateway": "g1", "deployments": {}}, now[0])
    asyncio.run(a.run_pass())
    assert a.memory.containers[c.key].status == "ready"  # the minimum holds it
    a.fleet.fold(log.put(E.DeploymentScaled(deployment_id="web-v1", min_containers=0)))
    asyncio.run(a.run_pass())
    assert a.memory.containers[c.key].status == "stopping" and a.counters["stopped"] == 1


def _env(ev: E.ContainerRequested) -> tuple:
    env = envelope(ev, workspace="acme")
    return env, ev, subject_of(env, ev)


def test_a_start_restores_the_newest_stored_checkpoint_and_an_older_version_keeps_nothing_warm():
    log = Log()
    a = scaler(log)
    deploy(log, a, min_containers=1, max_containers=2)
    msg = log.put(E.DeploymentCreated(deployment_id="web-v1", name="web",
                                      spec=msgspec.structs.replace(spec(min_containers=1, max_containers=2),
                                                                   checkpoint_enabled=True)))
    a.fleet.fold(msg)  # v1 again, with checkpoints on (a redeploy of the same id replaces it)
    a.fleet.fold(log.put(E.CheckpointDumped(checkpoint_id="ck1", deployment_id="web-v1", worker_id="w1",
                                            size_bytes=10, sha256="s", location="http://cache/ck1")))
    a.fleet.fold(log.put(E.CheckpointStored(checkpoint_id="ck1", bucket="b", key="k", size_bytes=10, sha256="s")))
    asyncio.run(a.run_pass())
    [c] = requests(a.memory)
    assert c.request.checkpoint is not None and c.request.checkpoint.checkpoint_id == "ck1"
    assert c.request.checkpoint.location == "http://cache/ck1"
    v2 = msgspec.structs.replace(spec(min_containers=1, max_containers=2), name="web")
    a.fleet.fold(log.put(E.DeploymentCreated(deployment_id="web-v2", name="web", version=2, spec=v2)))
    assert a.fleet.deployments[("acme", "web-v1")].policy.min_containers == 0
    assert a.fleet.deployments[("acme", "web-v2")].policy.min_containers == 1


def test_a_task_queue_scales_on_its_waiting_tasks():
    from levers9.contracts.task_spec import TaskQueueOptions

    log = Log()
    a = scaler(log)
    fn = DeploymentSpec(name="jobs", code=Code(kind="function", module="m", handler="h"),
                        scaling=Scaling(max_containers=5, scaledown_window=0),
                        task_queue=TaskQueueOptions(tasks_per_container=2))
    a.fleet.fold(log.put(E.DeploymentCreated(deployment_id="jobs-v1", name="jobs", spec=fn)))
    for i in range(5):
        a.fleet.fold(log.put(E.TaskEnqueued(task_id=f"t{i}", deployment_id="jobs-v1", queue="jobs", enqueued_at=0.0)))
    asyncio.run(a.run_pass())
    started = requests(a.memory)
    assert len(started) == 3 and "5 queued tasks at tasks_per_container=2" in started[0].request.reason
    a.fleet.fold(log.put(E.TaskStarted(task_id="t0", deployment_id="jobs-v1", attempt=1, runner="g")))
    adhoc = DeploymentSpec(name="fn-abc", code=Code(kind="function", module="", handler=""),
                           scaling=Scaling(min_containers=1))
    a.fleet.fold(log.put(E.DeploymentCreated(deployment_id="fn-abc-v1", name="fn-abc", spec=adhoc)))
    assert ("acme", "fn-abc-v1") not in a.fleet.deployments  # ad-hoc function sandboxes: the worker's rule


def test_a_container_started_across_its_deployments_stop_is_stopped_too():
    log = Log()
    a = scaler(log)
    deploy(log, a, min_containers=1, max_containers=2)
    asyncio.run(a.run_pass())
    [c] = requests(a.memory)
    a.memory.apply(log.put(E.ContainerReady(container_id=c.container_id, worker_id="w1", address="http://x")),
                   log.seq)
    a.fleet.fold(log.put(E.DeploymentStopped(deployment_id="web-v1")))
    asyncio.run(a.run_pass())
    assert a.memory.containers[c.key].status == "stopping" and requests(a.memory) == []


def test_a_deployed_function_is_kept_warm_and_its_sessions_sandbox_is_neither_counted_nor_stopped():
    log, now = Log(), [1_000_000.0]
    a = scaler(log, clock=lambda: now[0])
    fn = DeploymentSpec(name="zscore", code=Code(kind="function", module="stats", handler="zscore"),
                        scaling=Scaling(min_containers=1, max_containers=2, scaledown_window=2))
    a.fleet.fold(log.put(E.DeploymentCreated(deployment_id="zscore-v1", name="zscore", spec=fn)))
    session = log.put(E.ContainerRequested(container_id="s1", deployment_id="zscore-v1", spec=fn, session_id="abc",
                                           reason="function call"))
    a.memory.apply(session, log.seq)
    a.memory.apply(log.put(E.ContainerReady(container_id="s1", worker_id="w1", address="http://s")), log.seq)
    a.fleet.ready_at[("acme", "s1")] = now[0]
    asyncio.run(a.run_pass())
    [c] = requests(a.memory)  # the session's ready sandbox is not the deployment's: the minimum is started
    assert c.container_id == autoscaled_id("acme", "zscore-v1", 0) and not c.request.session_id
    assert c.request.reason.startswith("autoscaler: min_containers=1")
    a.memory.apply(log.put(E.ContainerReady(container_id=c.container_id, worker_id="w1", address="http://x")),
                   log.seq)
    a.fleet.ready_at[c.key] = now[0]
    a.fleet.fold(log.put(E.DeploymentScaled(deployment_id="zscore-v1", min_containers=0)))
    now[0] += 60
    a.fleet.sampled("g1", {"gateway": "g1", "deployments": {}}, now[0])
    asyncio.run(a.run_pass())
    assert a.memory.containers[c.key].status == "stopping"  # idle past its window, no minimum: scaled down
    assert a.memory.containers[("acme", "s1")].status == "ready" and a.counters["stopped"] == 1  # the session's



def test_events_from_before_the_session_field_decode_as_no_session():
    ev = E.ContainerRequested(container_id="c", deployment_id="d-v1", session_id="abc")
    assert msgspec.json.decode(msgspec.json.encode(ev), type=E.ContainerRequested).session_id == "abc"
    old = msgspec.json.encode({"container_id": "c", "worker_id": "w"})  # from before the field: no session
    assert msgspec.json.decode(old, type=E.ContainerScheduled).session_id == ""
    assert msgspec.json.decode(msgspec.json.encode({"container_id": "c"}), type=E.ContainerRequested).session_id == ""


def test_a_resubscribe_reads_on_from_what_was_folded_not_from_the_start():
    """The ordered replay is resubscribed every 30 s idle: from 1 again, a pass mid-replay saw
    deleted deployments alive (CI's scheduler logs showed it reading from 1 every 30 s)."""
    log = Log()
    a = scaler(log)
    assert asyncio.run(a.position()) == 0
    msg = log.put(E.DeploymentCreated(deployment_id="web-v1", name="web", spec=spec(min_containers=1)))
    gone = log.put(E.DeploymentDeleted(deployment_id="web-v1"))
    asyncio.run(a.apply([Delivery(3, m.subject, b"", {}, 1, m) for m in (msg, gone)]))
    assert asyncio.run(a.position()) == 3 and not a.fleet.deployments[("acme", "web-v1")].active


def test_idleness_counts_only_up_to_the_gateways_latest_sample():
    """Called every half second, a container looked idle for its whole 2 s window when the only
    sample was a second or two old: a call may have come in since."""
    log, now = Log(), [1_000_000.0]
    a = scaler(log, clock=lambda: now[0])
    deploy(log, a, min_containers=0, max_containers=2, scaledown_window=2)
    req = log.put(E.ContainerRequested(container_id="c1", deployment_id="web-v1", reason="call waiting"))
    a.memory.apply(req, log.seq)
    ready = log.put(E.ContainerReady(container_id="c1", worker_id="w1", address="http://x"))
    a.memory.apply(ready, log.seq)
    a.fleet.ready_at[("acme", "c1")] = now[0] - 60

    def report(at: float) -> None:
        a.fleet.sampled("g1", {"gateway": "g1", "at": at, "deployments": {
            "acme/web-v1": {"waiting": 0, "containers": {"c1": [0, now[0] - 3]}}}}, at)

    report(now[0] - 2)  # it said: idle since 3 s ago, as of 2 s ago: 1 s of known idleness
    asyncio.run(a.run_pass())
    assert a.memory.containers[("acme", "c1")].status == "ready"
    report(now[0])  # as of now: 3 s, past the window
    asyncio.run(a.run_pass())
    assert a.memory.containers[("acme", "c1")].status == "stopping"
