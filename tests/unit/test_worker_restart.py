"""levers9.worker.restart.gone: which containers a worker's new run reports as failed at start."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from levers9.worker.restart import BEGUN, gone

STATUSES = ("requested", "pending", "scheduled", "starting", "ready", "stopping", "stopped", "failed")


def row(cid: str, status: str, last_seq: int = 10, ws: str = "acme") -> dict:
    return {"workspace": ws, "container_id": cid, "status": status, "correlation_id": f"c-{cid}",
            "last_seq": last_seq}


def test_begun_containers_this_run_does_not_run_are_gone():
    rows = [row("a", "ready"), row("b", "starting"), row("c", "stopping"), row("d", "stopped"),
            row("e", "failed"), row("f", "ready")]
    assert gone(rows, running={"f"}, acked=0) == [("acme", "a", "c-a"), ("acme", "b", "c-b"), ("acme", "c", "c-c")]


def test_a_scheduled_container_is_gone_only_once_its_placement_was_acknowledged():
    rows = [row("early", "scheduled", last_seq=5), row("late", "scheduled", last_seq=9)]
    # placement 9 was never acknowledged: it is delivered again to the new run, which starts it
    assert gone(rows, running=(), acked=7) == [("acme", "early", "c-early")]
    assert gone(rows, running=(), acked=9) == [("acme", "early", "c-early"), ("acme", "late", "c-late")]


@given(st.lists(st.tuples(st.sampled_from(STATUSES), st.integers(1, 100), st.booleans()), max_size=30),
       st.integers(0, 100))
def test_never_what_runs_never_what_ended_and_never_a_placement_still_to_come(specs, acked):
    rows = [row(f"c{i}", status, seq) for i, (status, seq, _) in enumerate(specs)]
    running = {f"c{i}" for i, (_, _, runs) in enumerate(specs) if runs}
    out = {cid for _, cid, _ in gone(rows, running, acked)}
    by_id = {r["container_id"]: r for r in rows}
    for cid in out:
        r = by_id[cid]
        assert cid not in running
        assert r["status"] in BEGUN or (r["status"] == "scheduled" and r["last_seq"] <= acked)
    for r in rows:  # and everything begun that does not run is reported
        if r["status"] in BEGUN and r["container_id"] not in running:
            assert r["container_id"] in out
