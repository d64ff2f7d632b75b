"""The pool controller's time rules are pure: the clock is an argument, so time moves by passing a number."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.pool_controller.pools import PoolConfig, PoolWorker, pool_delta
from levers9.pool_controller.rules import (
    EXITED,
    EXITED_BEFORE_REGISTERING,
    HEARTBEAT_EXPIRED,
    NEVER_REGISTERED,
    REASONS,
    Heartbeats,
    WorkerLoad,
    WorkerState,
    idle_for,
    idle_since,
    lost_workers,
)

STATUSES = ["provisioning", "registered", "ready", "lost", "drained"]
TTL, GRACE, PROVISION = 6.0, 6.0, 120.0
NOW = 1_000_000.0
ages = st.floats(0, 300, allow_nan=False)


@st.composite
def scenes(draw):
    """(workers, heartbeats, exited): up to 6 workers with statuses, ages and heartbeats drawn at random."""
    workers, seen, exited = [], {}, set()
    for i in range(draw(st.integers(0, 6))):
        wid = f"w{i}"
        prov = draw(st.one_of(st.none(), ages))
        workers.append(WorkerState(wid, draw(st.sampled_from(STATUSES)), NOW - draw(ages),
                                   None if prov is None else NOW - prov))
        if draw(st.booleans()):
            seen[wid] = NOW - draw(ages)
        if draw(st.booleans()):
            exited.add(wid)
    return workers, Heartbeats(seen, draw(st.booleans())), frozenset(exited)


def lost(workers, heartbeats, exited, now=NOW):
    return dict(lost_workers(workers, heartbeats, now, TTL, GRACE, exited=exited, provision_timeout=PROVISION))


@settings(max_examples=400, deadline=None)
@given(scene=scenes())
def test_every_decision_names_a_reason_and_an_alive_worker(scene):
    workers, heartbeats, exited = scene
    decisions = lost_workers(workers, heartbeats, NOW, TTL, GRACE, exited=exited, provision_timeout=PROVISION)
    ids = [wid for wid, _ in decisions]
    assert len(ids) == len(set(ids))
    by_id = {w.worker_id: w for w in workers}
    for wid, why in decisions:
        assert why in REASONS
        assert by_id[wid].status in ("provisioning", "registered", "ready")  # lost/drained are never lost again
        if by_id[wid].status == "provisioning":
            assert why in (EXITED_BEFORE_REGISTERING, NEVER_REGISTERED)
        else:
            assert why in (EXITED, HEARTBEAT_EXPIRED)


@settings(max_examples=400, deadline=None)
@given(scene=scenes())
def test_fresh_heartbeat_or_grace_or_unknown_table_never_loses_a_running_worker(scene):
    workers, heartbeats, exited = scene
    decisions = lost(workers, heartbeats, exited)
    for w in workers:
        if w.status not in ("registered", "ready") or w.worker_id in exited:
            continue
        if heartbeats.fresh(w.worker_id, NOW, TTL):
            assert w.worker_id not in decisions, "a worker with a fresh heartbeat is never lost"
        if NOW - w.since <= GRACE:
            assert w.worker_id not in decisions, "a registered worker within its grace is never lost"
        if not heartbeats.current:
            assert w.worker_id not in decisions, "an unknown heartbeat table declares no one lost"


@settings(max_examples=400, deadline=None)
@given(scene=scenes())
def test_the_rule_fires_when_it_must(scene):
    workers, heartbeats, exited = scene
    decisions = lost(workers, heartbeats, exited)
    for w in workers:
        if w.status not in ("provisioning", "registered", "ready"):
            continue
        if w.worker_id in exited:
            assert decisions[w.worker_id] in (EXITED, EXITED_BEFORE_REGISTERING)
        elif w.status == "provisioning":
            started = w.since if w.provisioning_since is None else w.provisioning_since
            assert (decisions.get(w.worker_id) == NEVER_REGISTERED) == (NOW - started > PROVISION)
        elif heartbeats.current and not heartbeats.fresh(w.worker_id, NOW, TTL) and NOW - w.since > GRACE:
            assert decisions[w.worker_id] == HEARTBEAT_EXPIRED


@settings(max_examples=300, deadline=None)
@given(scene=scenes(), later=st.floats(0, 500, allow_nan=False))
def test_a_lost_worker_stays_lost_as_time_passes(scene, later):
    workers, heartbeats, exited = scene
    now_lost = lost(workers, heartbeats, exited)
    then_lost = lost(workers, heartbeats, exited, NOW + later)
    assert now_lost.items() <= then_lost.items()


def test_examples_of_the_rule():
    hb = Heartbeats({"a": NOW - 1, "b": NOW - 7}, current=True)
    workers = [WorkerState("a", "ready", NOW - 100), WorkerState("b", "ready", NOW - 100),
               WorkerState("c", "registered", NOW - 3), WorkerState("d", "provisioning", NOW - 200, NOW - 121),
               WorkerState("e", "provisioning", NOW - 200, NOW - 10), WorkerState("f", "lost", NOW - 500)]
    assert lost_workers(workers, hb, NOW, TTL, GRACE, exited=frozenset({"e"})) == [
        ("b", HEARTBEAT_EXPIRED), ("d", NEVER_REGISTERED), ("e", EXITED_BEFORE_REGISTERING)]
    # the same scene with a table that could not be read: only what does not need heartbeats
    assert lost_workers(workers, Heartbeats(hb.seen, current=False), NOW, TTL, GRACE, exited=frozenset({"e"})) == [
        ("d", NEVER_REGISTERED), ("e", EXITED_BEFORE_REGISTERING)]
    # "c" registered 3 s ago: its grace ends at 6 s
    assert ("c", HEARTBEAT_EXPIRED) in lost_workers(workers, hb, NOW + 3.5, TTL, GRACE)
    assert Heartbeats().current is False  # a table nobody has read yet is unknown


# ---- idle workers ---------------------------------------------------------------------------------

@st.composite
def loads(draw):
    return [WorkerLoad(f"w{i}", draw(st.sampled_from(STATUSES)), draw(st.booleans()))
            for i in range(draw(st.integers(0, 6)))]


@settings(max_examples=400, deadline=None)
@given(before=st.dictionaries(st.sampled_from([f"w{i}" for i in range(8)]), st.floats(0, NOW, allow_nan=False)),
       fleet=loads(), later=st.floats(0, 500, allow_nan=False))
def test_idle_since_counts_from_the_first_idle_pass(before, fleet, later):
    since = idle_since(before, fleet, NOW)
    assert set(since) == {w.worker_id for w in fleet if w.status == "ready" and not w.busy}
    for wid, at in since.items():
        assert at == before.get(wid, NOW)  # kept while idle, else starts now
    for w in fleet:
        assert idle_for(since, w.worker_id, NOW + later) >= 0
        if w.busy or w.status != "ready":
            assert idle_for(since, w.worker_id, NOW + later) == 0
    # the next pass with the same fleet keeps every time: idle time only grows
    again = idle_since(since, fleet, NOW + later)
    assert again == since


def test_an_idle_managed_worker_is_stopped_once_its_idle_time_passes_the_timeout():
    pool = PoolConfig("p", min_warm=1, max_workers=3, idle_timeout_s=30)
    fleet = [WorkerLoad("keep", "ready", True), WorkerLoad("m", "ready", False)]
    since = idle_since({}, fleet, NOW)

    def delta(now: float, fleet=fleet, since=since):
        return pool_delta(pool, [PoolWorker(w.worker_id, w.status, True, w.busy, idle_for(since, w.worker_id, now))
                                 for w in fleet], backlog=0)

    assert delta(NOW + 29).stop == ()
    assert delta(NOW + 31).stop == ("m",)
    busy_again = [WorkerLoad("keep", "ready", True), WorkerLoad("m", "ready", True)]
    since = idle_since(since, busy_again, NOW + 20)  # it took a container before the timeout: the count restarts
    idle_again = [WorkerLoad("keep", "ready", True), WorkerLoad("m", "ready", False)]
    since = idle_since(since, idle_again, NOW + 25)
    assert delta(NOW + 31, since=since).stop == ()
    assert delta(NOW + 56, since=since).stop == ("m",)
