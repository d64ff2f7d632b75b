"""The scheduler's memory is a pure fold of its events: properties of capacity, idempotence and order."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_helpers import CONTAINERS, WORKERS, WS, logs, msg, registered, requested, worker_events

from levers9.contracts import events as E
from levers9.scheduler.memory import Memory
from levers9.scheduler.placement import Request, place
from levers9.scheduler.state import (
    Container,
    State,
    Worker,
    fold,
    fold_all,
    fold_worker,
    forget_finished,
    lost_containers,
    re_request,
    releases,
)


def used_matches_slots(w: Worker) -> bool:
    s = w.state
    return (s.cpu_used == sum(x.cpu_millicores for x in w.slots.values())
            and s.memory_used == sum(x.memory_mib for x in w.slots.values())
            and s.gpu_used == sum(x.gpu_count for x in w.slots.values()))


@settings(max_examples=300, deadline=None)
@given(events=worker_events("w0"))
def test_used_capacity_is_the_sum_of_the_slots_held_and_never_negative(events):
    w = None
    for seq, ev in enumerate(events, start=1):
        w = fold_worker(w, ev, seq)
        assert used_matches_slots(w)
        assert w.state.cpu_used >= 0 and w.state.memory_used >= 0 and w.state.gpu_used >= 0
        assert w.last_seq == seq


@settings(max_examples=300, deadline=None)
@given(data=st.data(), cpu=st.sampled_from([1000, 2000]), mem=st.sampled_from([1024, 2048]))
def test_reservations_admitted_by_placement_never_take_more_than_the_worker_has(data, cpu, mem):
    """Each reservation is appended only when place() found room on the state folded so far (what
    optimistic concurrency guarantees in log order), releases come in any order, for any slot."""
    state = fold_all(State(), [(msg(registered("w0", cpu=cpu, mem=mem)), 1), (msg(E.WorkerReady(worker_id="w0")), 2)])
    seq = 2
    for _ in range(data.draw(st.integers(0, 30))):
        seq += 1
        cid = data.draw(st.sampled_from(CONTAINERS))
        if data.draw(st.booleans()):
            req = Request(cid, data.draw(st.sampled_from([100, 400, 900])), data.draw(st.sampled_from([64, 700])))
            if place(req, [state.workers["w0"].state]).worker_id is None:
                continue
            ev: E.Event = E.WorkerSlotReserved(worker_id="w0", container_id=cid, workspace=WS,
                                               cpu_millicores=req.cpu_millicores, memory_mib=req.memory_mib)
        else:
            held = state.workers["w0"].slots.get(cid)
            named = data.draw(st.sampled_from([0, held.reserved_seq if held else 0, seq - 1]))
            ev = E.WorkerSlotReleased(worker_id="w0", container_id=cid, reserved_seq=named)
        state = fold(state, msg(ev), seq)
        w = state.workers["w0"].state
        assert 0 <= w.cpu_used <= w.cpu_millicores and 0 <= w.memory_used <= w.memory_mib


@settings(max_examples=200, deadline=None)
@given(log=logs(), cpu=st.sampled_from([100, 1500]), mem=st.sampled_from([64, 900]))
def test_a_reservation_and_its_release_cancel_out(log, cpu, mem):
    before = fold_all(State(), log)
    seq = len(log) + 1
    cid = "fresh"  # a container with no slot anywhere yet
    reserved = fold(before, msg(E.WorkerSlotReserved(worker_id="w0", container_id=cid, workspace=WS,
                                                     cpu_millicores=cpu, memory_mib=mem)), seq)
    after = fold(reserved, msg(E.WorkerSlotReleased(worker_id="w0", container_id=cid, reserved_seq=seq)), seq + 1)
    w0, w1 = before.workers["w0"], after.workers["w0"]
    assert w1.state == replace(w0.state, last_seq=seq + 1)
    assert dict(w1.slots) == dict(w0.slots)


@settings(max_examples=200, deadline=None)
@given(log=logs(), data=st.data())
def test_applying_an_event_again_changes_nothing(log, data):
    """A redelivery (or our own append coming back through the consumer) is a no-op: re-applying
    any event already folded, at any later point, leaves the state as it is."""
    state = fold_all(State(), log)
    if log:
        again = data.draw(st.lists(st.sampled_from(log), max_size=10))
        assert fold_all(state, again) == state


@settings(max_examples=200, deadline=None)
@given(log=logs(), data=st.data())
def test_the_order_between_aggregates_does_not_matter(log, data):
    """Worker and container events come through two consumers: any merge that keeps each
    aggregate's own order folds to the same state."""
    by_aggregate: dict[str, list] = {}
    for m, seq in log:
        by_aggregate.setdefault(m.subject.rsplit(".", 1)[0], []).append((m, seq))
    streams = list(by_aggregate.values())
    merged, cursors = [], [0] * len(streams)
    while any(c < len(s) for c, s in zip(cursors, streams, strict=True)):
        i = data.draw(st.sampled_from([i for i, s in enumerate(streams) if cursors[i] < len(s)]))
        merged.append(streams[i][cursors[i]])
        cursors[i] += 1
    assert fold_all(State(), merged) == fold_all(State(), log)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_releases_commute(data):
    """Releases applied in any order leave the same slots and the same used capacity."""
    reserve = [msg(E.WorkerSlotReserved(worker_id="w0", container_id=c, workspace=WS, cpu_millicores=100 * (i + 1),
                                        memory_mib=64)) for i, c in enumerate(CONTAINERS)]
    state = fold_all(State(), [(msg(registered("w0", cpu=4000)), 1)] + [(m, i + 2) for i, m in enumerate(reserve)])
    chosen = data.draw(st.lists(st.sampled_from(CONTAINERS), unique=True))
    rel = [E.WorkerSlotReleased(worker_id="w0", container_id=c, reserved_seq=CONTAINERS.index(c) + 2) for c in chosen]
    first = fold_all(state, [(msg(e), 100 + i) for i, e in enumerate(rel)])
    shuffled = data.draw(st.permutations(rel))
    second = fold_all(state, [(msg(e), 100 + i) for i, e in enumerate(shuffled)])
    assert dict(first.workers["w0"].slots) == dict(second.workers["w0"].slots)
    assert first.workers["w0"].state == second.workers["w0"].state
    assert sorted(first.workers["w0"].slots) == sorted(set(CONTAINERS) - set(chosen))


@settings(max_examples=200, deadline=None)
@given(log=logs())
def test_memory_folds_in_place_exactly_like_the_pure_fold(log):
    memory = Memory()
    for m, seq in log:
        memory.apply(m, seq)
    assert memory.state() == fold_all(State(), log)
    holders: dict[str, set[str]] = {}
    for w in memory.workers.values():
        for cid in w.slots:
            holders.setdefault(cid, set()).add(w.worker_id)
    assert memory.holders == holders
    assert [c.key for c in memory.backlog()] == [c.key for c in sorted(memory.containers.values(),
                                                                         key=lambda c: c.order) if c.waiting]


def test_a_release_names_its_reservation_so_a_lost_race_never_frees_the_winners_slot():
    state = fold_all(State(), [(msg(registered("w0")), 1),
                               (msg(E.WorkerSlotReserved(worker_id="w0", container_id="c0", workspace=WS,
                                                         cpu_millicores=500, memory_mib=64)), 5)])
    # the loser's reservation of c0 (seq 7) was never there: its release (naming 7) frees nothing
    after = fold(state, msg(E.WorkerSlotReleased(worker_id="w0", container_id="c0", reserved_seq=7)), 8)
    assert after.workers["w0"].slots["c0"].reserved_seq == 5 and after.workers["w0"].state.cpu_used == 500


def test_room_moves_only_when_capacity_may_have_appeared():
    s = fold_all(State(), [(msg(registered("w0")), 1)])
    assert s.room == 0  # registered is not ready
    s = fold(s, msg(E.WorkerReady(worker_id="w0")), 2)
    assert s.room == 1
    s = fold(s, msg(E.WorkerSlotReserved(worker_id="w0", container_id="c0", workspace=WS, cpu_millicores=500,
                                         memory_mib=64)), 3)
    assert s.room == 1  # taking capacity never lets anything else fit
    s = fold(s, msg(E.WorkerSlotReleased(worker_id="w0", container_id="c0")), 4)
    assert s.room == 2


def test_a_container_remembers_the_request_it_was_last_asked_with_and_keeps_its_place():
    s = fold_all(State(), [(msg(requested("c0", cpu=700)), 3), (msg(E.ContainerScheduled(container_id="c0",
                                                                                        worker_id="w0")), 4)])
    c = s.containers[(WS, "c0")]
    assert c.status == "scheduled" and c.worker_id == "w0" and c.request.resources.cpu_millicores == 700
    again = fold(s, msg(requested("c0", cpu=900, attempt=2)), 9)
    c2 = again.containers[(WS, "c0")]
    assert c2.status == "requested" and c2.worker_id == "" and c2.order == 3 and c2.request.attempt == 2
    assert c2.waiting


def _placed(status: str, worker: str = "w0", last_seq: int = 10) -> dict:
    c = Container(WS, "c0", status, last_seq, 1, worker_id=worker, correlation_id="corr",
                  request=requested("c0", excluded=["w9"], note="cold: no checkpoint yet"))
    return {c.key: c}


def _with_slot(reserved_seq: int = 5) -> dict:
    s = fold_all(State(), [(msg(registered("w0")), 1),
                           (msg(E.WorkerSlotReserved(worker_id="w0", container_id="c0", workspace=WS,
                                                     cpu_millicores=500, memory_mib=64)), reserved_seq)])
    return dict(s.workers)


def test_slots_of_stopped_failed_and_moved_containers_are_released_and_others_kept():
    workers = _with_slot()
    assert [r.reason for r in releases(workers, _placed("stopped"))] == ["stopped"]
    assert [r.reason for r in releases(workers, _placed("failed"))] == ["failed"]
    assert releases(workers, _placed("ready")) == []
    assert [r.slot.reserved_seq for r in releases(workers, _placed("scheduled", worker="w1"))] == [5]  # moved
    assert releases(workers, _placed("requested", last_seq=3)) == []  # requested before the reservation
    assert len(releases(workers, _placed("requested", last_seq=9))) == 1  # requested again since
    assert releases(workers, _placed("stopped"), only=[(WS, "other")]) == []
    assert releases(workers, {}) == []  # a container we do not know keeps its slot


def test_a_lost_workers_containers_are_requested_again_from_their_request():
    s = fold_all(State(), [(msg(registered("w0")), 1), (msg(E.WorkerLost(worker_id="w0")), 2)])
    containers = _placed("ready")
    [c] = lost_containers(s.workers, containers.values())
    again = re_request(c)
    assert again.attempt == 2 and again.excluded_workers == ["w9"] and again.reason == "worker w0 lost"
    assert again.resources == c.request.resources and again.note == c.request.note
    assert again.deployment_id == "d1" and again.deployment_version == 3
    assert lost_containers(s.workers, _placed("stopped").values()) == []


def test_a_lost_worker_that_awaits_a_fence_keeps_its_containers_until_it_is_fenced():
    """A container id never runs twice: a WorkerLost that awaits a fence holds its containers back
    until WorkerFenced (the pool controller's reaper) or a new run of the worker (which fenced them)."""
    lost = [(msg(registered("w0")), 1), (msg(E.WorkerLost(worker_id="w0", awaits_fence=True)), 2)]
    containers = _placed("ready").values()
    assert lost_containers(fold_all(State(), lost).workers, containers) == []
    fenced = fold_all(State(), [*lost, (msg(E.WorkerFenced(worker_id="w0", containers=["c0"])), 3)])
    assert [c.container_id for c in lost_containers(fenced.workers, containers)] == ["c0"]
    # a WorkerFenced that came before the loss (a start's) fences nothing of the run lost after it
    early = fold_all(State(), [(msg(registered("w0")), 1), (msg(E.WorkerFenced(worker_id="w0")), 2),
                               (msg(E.WorkerLost(worker_id="w0", awaits_fence=True)), 3)])
    assert lost_containers(early.workers, containers) == []


@settings(max_examples=200, deadline=None)
@given(events=worker_events("w0"), awaits=st.booleans())
def test_no_container_of_a_lost_worker_is_requested_again_between_its_loss_and_its_fence(events, awaits):
    w = None
    for seq, ev in enumerate([*events, E.WorkerLost(worker_id="w0", awaits_fence=awaits)], start=1):
        w = fold_worker(w, ev, seq)
    assert w is not None and w.state.fence_awaited == awaits
    assert bool(lost_containers({"w0": w}, _placed("ready").values())) == (not awaits)


def test_finished_containers_are_forgotten_once_they_hold_no_slot():
    workers = _with_slot()
    assert forget_finished(_placed("stopped"), workers.values()) == []
    assert forget_finished(_placed("stopped"), []) == [(WS, "c0")]
    assert forget_finished(_placed("ready"), []) == []


def test_every_generated_worker_is_known():
    assert WORKERS == ["w0", "w1"]


def test_a_stop_asked_for_after_the_container_ended_leaves_it_ended():
    from levers9.scheduler.state import fold_container

    c = None
    for seq, ev in enumerate([E.ContainerRequested(container_id="c1"), E.ContainerStopped(container_id="c1", worker_id=""),
                              E.ContainerStopRequested(container_id="c1", reason="stopped by user")], start=1):
        c = fold_container(c, msg(ev), seq)
    assert c is not None and (c.status, c.last_seq) == ("stopped", 3)
