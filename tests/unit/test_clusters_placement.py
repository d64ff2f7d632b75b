"""Attached clusters in the scheduler: a cluster's workers take only the work of the workspaces its
cluster admits (owner, shared), whatever else the fleet and the backlog look like. Pure."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_helpers import msg, requested

from levers9.contracts import events as E
from levers9.contracts.events.cluster import ClusterAttached, ClusterDetached, ClusterShared
from levers9.scheduler.placement import WorkerState, admitted, not_admitted
from levers9.scheduler.plan import Defer, Place, plan
from levers9.scheduler.state import Container, State, access_of, fold, fold_cluster, fold_worker

WORKSPACES = ["a", "b", "c"]
CLUSTERS = ["c1", "c2"]
REFS = [f"{w}/{c}" for w in WORKSPACES for c in CLUSTERS]  # what pools and workers name


@st.composite
def fleets(draw):
    out = {}
    for i in range(draw(st.integers(1, 6))):
        out[f"w{i}"] = WorkerState(f"w{i}", draw(st.sampled_from(["default", "edge"])), "ready",
                                   draw(st.sampled_from([1000, 4000])), 4096,
                                   cluster=draw(st.sampled_from(["", *REFS])))
    return out


@st.composite
def cluster_logs(draw):
    """(owner, event) in log order: attaches, shares and detaches, by owners and by others."""
    out = []
    for _ in range(draw(st.integers(0, 8))):
        name, ws = draw(st.sampled_from(CLUSTERS)), draw(st.sampled_from(WORKSPACES))
        kind = draw(st.sampled_from(["attach", "share", "detach"]))
        ev: E.Event = (ClusterAttached(name=name) if kind == "attach" else ClusterDetached(name=name)
                       if kind == "detach" else ClusterShared(name=name, workspace=draw(st.sampled_from(WORKSPACES))))
        out.append((ws, ev))
    return out


@st.composite
def backlogs(draw):
    return [Container(draw(st.sampled_from(WORKSPACES)), f"k{i}", "requested", i + 1, i + 1,
                      request=requested(f"k{i}", cpu=draw(st.sampled_from([100, 500])),
                                        pool=draw(st.sampled_from(["default", "edge"]))))
            for i in range(draw(st.integers(1, 12)))]


def _clusters(log):
    clusters: dict = {}
    for owner, ev in log:
        clusters = fold_cluster(clusters, owner, ev)
    return clusters


@settings(max_examples=300, deadline=None)
@given(fleets(), cluster_logs(), backlogs())
def test_a_cluster_worker_never_gets_a_workspace_its_cluster_does_not_admit(workers, log, backlog):
    clusters = _clusters(log)
    access = access_of(clusters)
    for step in plan(workers, backlog, access=access):
        if isinstance(step, Place):
            w = workers[step.worker_id]
            if w.cluster:
                owner, allowed = clusters[w.cluster]
                assert step.container.workspace in allowed
                # admitted means: the owner, or a workspace the owner shared it with after attaching
                assert owner in allowed


@settings(max_examples=200, deadline=None)
@given(fleets(), backlogs())
def test_without_clusters_admitted_everything_is_as_before(workers, backlog):
    plain = {k: WorkerState(w.worker_id, w.pool, w.status, w.cpu_millicores, w.memory_mib) for k, w in workers.items()}
    assert plan(plain, backlog, access={"a/c1": frozenset({"a"})}) == plan(plain, backlog)


def test_the_owner_and_shared_workspaces_use_a_cluster_others_wait_with_the_reason():
    workers = {"cw": WorkerState("cw", "edge", "ready", 4000, 4096, cluster="a/c1")}
    clusters = _clusters([("a", ClusterAttached(name="c1"))])
    backlog = [Container("a", "k1", "requested", 1, 1, request=requested("k1", pool="edge")),
               Container("b", "k2", "requested", 2, 2, request=requested("k2", pool="edge"))]
    steps = plan(workers, backlog, access=access_of(clusters))
    assert isinstance(steps[0], Place) and steps[0].worker_id == "cw"
    assert isinstance(steps[1], Defer)
    assert "cluster a/c1" in steps[1].reason and "not shared with workspace 'b'" in steps[1].reason
    shared = _clusters([("a", ClusterAttached(name="c1")), ("a", ClusterShared(name="c1", workspace="b"))])
    steps = plan(workers, backlog, access=access_of(shared))
    assert [type(s) for s in steps] == [Place, Place]


def test_names_are_each_workspace_s_own_and_only_the_owner_shares_or_detaches():
    log = [("a", ClusterAttached(name="c1")), ("b", ClusterShared(name="c1", workspace="b")),
           ("b", ClusterAttached(name="c1")), ("b", ClusterDetached(name="c1"))]
    # b's c1 is another cluster: b's events touch only its own, a's stays as a left it
    assert _clusters(log) == {"a/c1": ("a", frozenset({"a"})), "b/c1": ("b", frozenset())}
    log += [("a", ClusterShared(name="c1", workspace="b")), ("a", ClusterDetached(name="c1"))]
    assert _clusters(log)["a/c1"] == ("a", frozenset())
    # detached admits nobody, and a share after it does not bring it back
    assert _clusters([*log, ("a", ClusterShared(name="c1", workspace="b"))])["a/c1"] == ("a", frozenset())
    w = WorkerState("cw", "edge", "ready", 1, 1, cluster="a/c1")
    assert not admitted("a", w, access_of(_clusters(log))) and not admitted("a", w, {})  # unknown: nobody
    assert admitted("z", WorkerState("pw", "edge", "ready", 1, 1), {})
    assert not_admitted("b", "edge", [w], {}) and not not_admitted("b", "other", [w], {})


def test_a_cluster_worker_keeps_its_provisioned_pool_and_cluster_whatever_it_registers():
    w = fold_worker(None, E.WorkerProvisioned(worker_id="cw", pool="edge", backend="cluster", cluster="a/c1"), 1)
    w = fold_worker(w, E.WorkerRegistered(worker_id="cw", pool="default", cpu_millicores=1, memory_mib=1), 2)
    assert (w.state.pool, w.state.cluster) == ("edge", "a/c1")
    plain = fold_worker(None, E.WorkerRegistered(worker_id="pw", pool="default", cpu_millicores=1, memory_mib=1), 1)
    assert (plain.state.pool, plain.state.cluster) == ("default", "")
    # the clusters consumer may bring WorkerProvisioned after the workers consumer moved on
    late = fold_worker(fold_worker(None, E.WorkerProvisioned(worker_id="x", pool="edge", backend="cluster"), 5),
                       E.WorkerProvisioned(worker_id="x", pool="edge", backend="cluster", cluster="c1"), 5)
    assert late.state.cluster == "c1"


def test_the_whole_fold_keeps_clusters_and_moves_room():
    s = fold(State(), msg(ClusterAttached(name="c1"), workspace="a"), 1)
    s = fold(s, msg(ClusterShared(name="c1", workspace="b"), workspace="a"), 2)
    assert s.clusters == {"a/c1": ("a", frozenset({"a", "b"}))} and s.room == 2


def test_a_cluster_worker_recovered_before_the_clusters_view_saw_it_admits_nobody():
    from levers9.scheduler.recovery import worker_state

    row = {"worker_id": "cw", "pool": "default", "status": "ready", "cpu_millicores": 1, "memory_mib": 1,
           "gpu_type": "", "gpu_count": 0, "cpu_used": 0, "memory_used": 0, "gpu_used": 0, "features": [],
           "cordoned": False, "last_seq": 3, "backend": "cluster"}
    assert worker_state(row, {"cw": "c1"}).cluster == "c1"
    unknown = worker_state(row, {})
    assert unknown.cluster == "?" and not admitted("default", unknown, {"c1": frozenset({"default"})})
    assert worker_state({**row, "backend": "local"}, {}).cluster == ""


def test_neither_a_worker_nor_a_publisher_can_sign_or_send_what_binds_a_worker_to_a_cluster():
    from levers9.contracts import subjects
    from levers9.runtime import nats_auth as A

    worker, publisher = A.worker_permissions("cw"), A.publisher_permissions("teamb", "p1")
    for event in ("WorkerProvisioned", "ClusterAttached", "ClusterShared", "ClusterDetached"):
        assert not A.owns(A.WORKER, event) and not A.owns("scheduler", event)
    assert A.owns("gateway", "ClusterShared") and A.owns("pool-controller", "WorkerProvisioned")
    for subject in (subjects.subject("_sys", "worker", "cw", "WorkerProvisioned"),
                    subjects.subject("_sys", "worker", "other", "WorkerRegistered"),
                    subjects.subject("teamb", "cluster", "c1", "ClusterShared"),
                    subjects.subject("default", "cluster", "c1", "ClusterAttached")):
        assert not A.may_publish(worker, subject) and not A.may_publish(publisher, subject), subject
    assert A.may_publish(worker, subjects.subject("_sys", "worker", "cw", "WorkerRegistered"))
    # the cluster requests: only the pool controller asks, only the gateway answers
    assert A.may_publish(A.service_permissions("pool-controller"), "levers9rpc.cluster.c1.start")
    for perms in (worker, publisher, A.service_permissions("scheduler")):
        assert not A.may_publish(perms, "levers9rpc.cluster.c1.start")
