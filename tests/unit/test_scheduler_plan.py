"""A scheduling pass and the decision for one typed request: pure, checked with generated fleets."""

from __future__ import annotations

from dataclasses import replace

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_helpers import WS, requested

from levers9.contracts.checkpoint_policy import cold_fallback_note, restore_note
from levers9.contracts.spec import CheckpointRef
from levers9.scheduler.decision import decide, request_from
from levers9.scheduler.placement import WorkerState, place, reserve
from levers9.scheduler.plan import Defer, Hold, Place, plan
from levers9.scheduler.state import Container

GPUS = ["T4", "A100"]


@st.composite
def fleets(draw):
    out = {}
    for i in range(draw(st.integers(0, 6))):
        cpu = draw(st.sampled_from([1000, 2000, 4000]))
        mem = draw(st.sampled_from([1024, 4096]))
        gpu_type = draw(st.sampled_from(["", *GPUS]))
        gpus = draw(st.integers(1, 4)) if gpu_type else 0
        out[f"w{i}"] = WorkerState(
            worker_id=f"w{i}", pool=draw(st.sampled_from(["default", "gpu"])),
            status=draw(st.sampled_from(["ready", "ready", "registered"])), cpu_millicores=cpu, memory_mib=mem,
            gpu_type=gpu_type, gpu_count=gpus, cpu_used=draw(st.integers(0, cpu)),
            memory_used=draw(st.integers(0, mem)), gpu_used=draw(st.integers(0, gpus)),
            features=frozenset(draw(st.sets(st.sampled_from(["runc", "criu"])))))
    return out


@st.composite
def backlogs(draw):
    out = []
    for i in range(draw(st.integers(0, 12))):
        gpu = draw(st.lists(st.sampled_from(GPUS), unique=True, max_size=2))
        ref = draw(st.none() | st.builds(CheckpointRef, checkpoint_id=st.just(f"ck{i}"),
                                         accelerator=st.sampled_from(["", *GPUS])))
        req = requested(f"c{i}", cpu=draw(st.sampled_from([100, 500, 1500])), mem=draw(st.sampled_from([64, 900])),
                        pool=draw(st.sampled_from(["default", "gpu"])), gpu=gpu,
                        gpu_count=draw(st.integers(0, 2)), checkpoint=ref)
        if out and draw(st.booleans()):  # runs of the same request (a deployment scaling up)
            req = msgspec.structs.replace(out[-1].request, container_id=f"c{i}")
        status = draw(st.sampled_from(["requested", "pending"]))
        out.append(Container(WS, f"c{i}", status, i + 1, i + 1, reason=draw(st.sampled_from(["", "x"])),
                             request=req))
    return out


@settings(max_examples=300, deadline=None)
@given(fleet=fleets(), backlog=backlogs())
def test_a_pass_is_placement_applied_in_order_and_never_plans_more_than_a_worker_has(fleet, backlog):
    steps = plan(fleet, backlog)
    assert [s.container for s in steps] == backlog  # one step per container, oldest first
    view = dict(fleet)
    for step in steps:  # the same as deciding one by one, each on the capacity the ones before left
        expected = decide(step.container.request, list(view.values()))
        if isinstance(step, Place):
            assert step.decision == expected
            view[step.worker_id] = reserve(view[step.worker_id], step.decision.request, 0)
        else:
            assert isinstance(step, Defer) and expected.worker_id is None and step.reason == expected.reason
            assert step.append == (step.container.status == "requested" or step.container.reason != step.reason)
    for w in view.values():
        original = fleet[w.worker_id]
        if w != original:  # whatever a pass takes fits in what the worker had free
            assert w.cpu_used <= w.cpu_millicores and w.memory_used <= w.memory_mib and w.gpu_used <= w.gpu_count


@settings(max_examples=100, deadline=None)
@given(fleet=fleets(), backlog=backlogs())
def test_a_pool_being_refreshed_holds_what_does_not_fit_instead_of_deferring_it(fleet, backlog):
    held = frozenset({"gpu"})
    for step in plan(fleet, backlog, held):
        pool = step.container.request.pool
        if pool == "gpu":
            assert not isinstance(step, Defer)
        else:
            assert not isinstance(step, Hold)


def ready(wid, features=("runc",), gpu_type="", gpus=0, cpu=2000):
    return WorkerState(wid, "default", "ready", cpu, 2048, gpu_type=gpu_type, gpu_count=gpus,
                       features=frozenset(features))


def test_a_checkpoint_restores_on_a_worker_with_criu_and_its_accelerator():
    ref = CheckpointRef(checkpoint_id="ck1", accelerator="")
    d = decide(requested("c", checkpoint=ref), [ready("plain"), ready("criu", features=("runc", "criu"))])
    assert d.worker_id == "criu" and d.checkpoint == ref and d.note == restore_note(ref)
    assert "criu" in d.request.features


def test_without_a_worker_that_can_restore_it_starts_cold_and_says_why():
    ref = CheckpointRef(checkpoint_id="ck1", accelerator="A100")
    d = decide(requested("c", checkpoint=ref), [ready("criu", features=("runc", "criu"))])
    assert d.worker_id == "criu" and d.checkpoint is None
    restorable = replace(request_from(requested("c")), features=frozenset({"criu"}), accelerator="A100")
    restore = place(restorable, [ready("criu", features=("runc", "criu"))])
    assert d.note == cold_fallback_note(ref, restore.reason) and "A100" in d.note


def test_a_request_without_a_checkpoint_keeps_the_gateways_note():
    d = decide(requested("c", note="cold: checkpoint_enabled is off"), [ready("w")])
    assert d.worker_id == "w" and d.checkpoint is None and d.note == "cold: checkpoint_enabled is off"


def test_the_typed_request_carries_resources_pool_gpus_and_exclusions():
    req = request_from(requested("c", cpu=750, mem=300, pool="gpu", gpu=["A100", "T4"], excluded=["w1"]))
    assert (req.cpu_millicores, req.memory_mib, req.pool, req.gpu, req.gpu_count, req.excluded) == \
        (750, 300, "gpu", ("A100", "T4"), 1, frozenset({"w1"}))


@settings(max_examples=150, deadline=None)
@given(fleet=fleets(), backlog=backlogs(), data=st.data())
def test_a_container_is_never_placed_where_a_slot_for_it_is_held_already(fleet, backlog, data):
    """A second reservation of the same slot would be one slot in the log: the worker holding one
    for the container is left out, and if only it had room, the container is held, not deferred."""
    ids = sorted(fleet)
    holders = {c.container_id: data.draw(st.sets(st.sampled_from(ids), min_size=1)) for c in backlog
               if ids and data.draw(st.booleans())}
    for step in plan(fleet, backlog, holders=holders):
        held_by = holders.get(step.container.container_id, set())
        if isinstance(step, Place):
            assert step.worker_id not in held_by
        if isinstance(step, Hold):  # no pool is being refreshed here: held only for its own slot
            assert held_by
