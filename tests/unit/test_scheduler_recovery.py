"""Memory at start is read from the projection's rows: the remembered request comes back as it was."""

from __future__ import annotations

import datetime as dt

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_helpers import requested

from levers9.contracts.spec import CheckpointRef, Code, DeploymentSpec, Resources
from levers9.scheduler.recovery import container, request_of, worker_state

SPEC = DeploymentSpec(name="app", code=Code(module="m", handler="h"), resources=Resources(cpu_millicores=300))


def row(**over):
    base = {"workspace": "default", "container_id": "c1", "status": "requested", "worker_id": "", "reason": "",
            "correlation_id": "corr", "last_seq": 7, "request": None, "requested_at": dt.datetime.now(dt.timezone.utc),
            "checkpoint_id": "", "accelerator": "", "cpu_millicores": 250, "memory_mib": 128, "gpu": [],
            "gpu_count": 0, "deployment_id": "d1", "deployment_version": 2, "pool": "", "attempt": 1,
            "excluded_workers": [], "note": ""}
    return {**base, **over}


@settings(max_examples=100, deadline=None)
@given(cpu=st.integers(1, 64_000), attempt=st.integers(1, 5), excluded=st.lists(st.sampled_from(["w1", "w2"])),
       ref=st.none() | st.builds(CheckpointRef, checkpoint_id=st.just("ck"), accelerator=st.sampled_from(["", "A100"])),
       as_text=st.booleans())
def test_the_request_column_decodes_to_the_event_it_was_written_from(cpu, attempt, excluded, ref, as_text):
    ev = msgspec.structs.replace(requested("c1", cpu=cpu, checkpoint=ref, excluded=excluded, attempt=attempt),
                                 spec=SPEC)
    stored = msgspec.json.encode(ev).decode()  # what ContainersView writes; asyncpg hands jsonb back as text
    assert request_of(row(request=stored if as_text else msgspec.json.decode(stored))) == ev


def test_a_row_from_before_the_request_column_is_rebuilt_from_its_columns():
    ev = request_of(row(checkpoint_id="ck", accelerator="T4", gpu=["T4"], gpu_count=1, excluded_workers=["w9"],
                        attempt=2, note="why", pool=""))
    assert ev is not None and ev.pool == "default" and ev.checkpoint == CheckpointRef(checkpoint_id="ck",
                                                                                      accelerator="T4")
    assert (ev.resources.cpu_millicores, ev.resources.gpu, ev.resources.gpu_count) == (250, ["T4"], 1)
    assert (ev.attempt, ev.excluded_workers, ev.note, ev.deployment_version) == (2, ["w9"], "why", 2)
    assert request_of(row(requested_at=None)) is None  # never requested: nothing to place


def test_rows_become_the_containers_and_workers_memory_holds():
    c = container(row(status="pending", reason="full", request=msgspec.json.encode(requested("c1")).decode()),
                  order=-3)
    assert (c.key, c.status, c.reason, c.order, c.last_seq, c.waiting) == (("default", "c1"), "pending", "full",
                                                                           -3, 7, True)
    w = worker_state({"worker_id": "w1", "pool": "p", "status": "ready", "cpu_millicores": 4000, "memory_mib": 8192,
                      "gpu_type": "", "gpu_count": 0, "cpu_used": 500, "memory_used": 256, "gpu_used": 0,
                      "features": ["runc", "criu"], "cordoned": False, "last_seq": 12})
    assert (w.cpu_free, w.memory_free, w.features, w.last_seq) == (3500, 7936, frozenset({"runc", "criu"}), 12)
