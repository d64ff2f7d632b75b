"""The cold-start waterfall is a pure function of a container's events: properties over any order,
any subset and any timing of its events, plus the three kinds and the cost model's estimate."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from levers9.dashboard.waterfall import KINDS, PHASES, as_text, parse_time, waterfall

CID = "c-1"
T0 = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.timezone.utc)
PATH = ["ContainerRequested", "ContainerScheduled", "ContainerStarted", "ContainerReady"]
STEPS = ["requested", "placed", "image mounted", "started", "ready"]  # the root's mount rides on ContainerStarted


def at(ms: float) -> str:
    return (T0 + dt.timedelta(milliseconds=ms)).strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def ev(seq: int, type_: str, ms: float, **data) -> dict:
    at = (T0 + dt.timedelta(milliseconds=ms)).strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"
    return {"seq": seq, "id": f"e{seq}", "type": type_, "occurred_at": at, "aggregate": "container",
            "aggregate_id": data.pop("aggregate_id", CID), "data": {"container_id": CID, **data}}


def a_start(gaps: list[float], restored: str = "", choice: dict | None = None, keep: list[bool] | None = None
            ) -> list[dict]:
    """The events of one start, a gap before each step of STEPS; `keep[i]` False leaves step i out."""
    keep = keep or [True] * len(STEPS)
    out, t, mounted = [], 0.0, ""
    for i, (step, gap) in enumerate(zip(STEPS, gaps, strict=False)):
        t += gap
        if step == "image mounted":
            mounted = at(t) if keep[i] else ""
            continue
        if not keep[i]:
            continue
        type_ = PATH[STEPS.index(step) - (step in ("started", "ready"))]
        extra: dict = {"restored_from": restored, "root_mounted_at": mounted} if type_ == "ContainerStarted" else {}
        if type_ == "ContainerScheduled" and choice:
            extra = {"choice": choice}
        out.append(ev(i + 1, type_, t, **extra))
    return out


gaps = st.lists(st.floats(0, 5000, allow_nan=False), min_size=len(STEPS), max_size=len(STEPS))
other = st.builds(lambda seq, t, ms: ev(seq, t, ms, aggregate_id="other"), st.integers(100, 200),
                  st.sampled_from(PATH), st.floats(0, 9000))


@given(gaps=gaps, keep=st.lists(st.booleans(), min_size=len(STEPS), max_size=len(STEPS)),
       noise=st.lists(other, max_size=5), order=st.randoms(use_true_random=False), restored=st.sampled_from(["", "ck-1"]))
def test_phases_are_in_order_and_their_times_add_up(gaps, keep, noise, order, restored):
    events = a_start(gaps, restored, keep=keep) + noise
    order.shuffle(events)
    w = waterfall(CID, events)
    names = [p["name"].replace("restored", "started") for p in w["phases"]]
    assert names == [n for n in PHASES if n in names]  # the documented order, whatever the input order
    # one phase per step kept (the mount only with the start that says it); nothing from another container
    assert len(names) == sum(keep) - (keep[2] and not keep[3])
    times = [parse_time(p["at"]) for p in w["phases"]]
    assert times == sorted(times)
    assert all(p["ms"] >= 0 for p in w["phases"])
    if w["phases"]:
        assert w["phases"][0]["ms"] == 0
        total = (times[-1] - times[0]).total_seconds() * 1000
        assert abs(sum(p["ms"] for p in w["phases"]) - total) < 0.1 * len(times)
    assert w["kind"] in KINDS
    assert waterfall(CID, list(reversed(events))) == w  # a function of the set of events, not their order


@given(gaps=gaps)
def test_a_phase_whose_clock_runs_behind_is_never_before_its_cause(gaps):
    events = a_start(gaps)
    events[2]["occurred_at"] = "2026-12-05T11:00:00.000000Z"  # the worker's clock an hour behind
    events[2]["data"]["root_mounted_at"] = "2026-12-05T10:59:59.000000Z"
    w = waterfall(CID, events)
    times = [parse_time(p["at"]) for p in w["phases"]]
    assert times == sorted(times)


def test_the_three_kinds_and_the_estimate():
    assert waterfall(CID, a_start([0, 10, 5, 300, 50]))["kind"] == "cold"
    assert [p["name"] for p in waterfall(CID, a_start([0, 10, 5, 300, 50], "ck-1"))["phases"]] == \
        ["requested", "placed", "image mounted", "restored", "ready"]
    assert waterfall(CID, a_start([0, 10, 5, 300, 50], "ck-1"))["kind"] == "restored"
    choice = {"chosen": {"candidate": "shared:cat-3", "seconds": 0.4, "missing_imports": ["scipy"]},
              "runner_up": {"candidate": "cold", "seconds": 2.5}}
    w = waterfall(CID, a_start([0, 10, 0, 300, 100], "cat-3", choice))
    assert w["kind"] == "shared checkpoint"
    assert w["estimate"] == {"candidate": "shared:cat-3", "seconds": 0.4, "missing_imports": ["scipy"],
                             "runner_up": {"candidate": "cold", "seconds": 2.5}, "actual_seconds": 0.4,
                             "actual_span": "placed -> ready"}
    # the shared checkpoint failed to restore: it started cold after all
    assert waterfall(CID, a_start([0, 10, 0, 300, 100], "", choice))["kind"] == "cold"
    # planned but not started yet: what the placement says
    assert waterfall(CID, a_start([0, 10], "", choice))["kind"] == "shared checkpoint"
    assert waterfall(CID, [])["phases"] == [] and waterfall(CID, [])["estimate"] is None


def test_first_answer_is_the_first_call_finished_in_this_container():
    events = a_start([0, 10, 5, 300, 50])
    events += [ev(10, "FunctionCallStarted", 400, call_id="k1", aggregate_id="k1"),
               {**ev(11, "FunctionCallFinished", 480, aggregate_id="k1"), "data": {"call_id": "k1", "outcome": "ok"}},
               {**ev(12, "FunctionCallFinished", 490, aggregate_id="k2"), "data": {"call_id": "k2", "outcome": "ok"}}]
    w = waterfall(CID, events)
    assert w["phases"][-1] == {"name": "first answer", "at": "2026-12-05T12:00:00.480Z", "ms": 115.0, "event_id": "e11"}
    text = as_text(w)
    assert "first answer" in text and "cold" in text and "total 480.0 ms" in text


def test_a_re_requested_container_shows_the_path_that_started_it():
    events = [ev(1, "ContainerRequested", 0), ev(2, "ContainerScheduled", 10), ev(3, "ContainerRequested", 5000),
              ev(4, "ContainerScheduled", 5010), ev(5, "ContainerStarted", 5300), ev(6, "ContainerReady", 5350)]
    w = waterfall(CID, events)
    assert [p["ms"] for p in w["phases"]] == [0, 10.0, 5290.0, 50.0]
    assert "not in the log: image mounted, first answer" in as_text(w)


def test_an_endpoints_first_answer_is_the_gateways_and_only_after_ready():
    events = a_start([0, 10, 5, 300, 50])
    w = waterfall(CID, events, first_answer_at=at(395))
    assert [p["name"] for p in w["phases"]] == ["requested", "placed", "image mounted", "started", "ready", "first answer"]
    assert w["phases"][-1]["ms"] == 30.0
    # a row that says answered while no ready is in the log: no phase is guessed
    assert "first answer" not in [p["name"] for p in waterfall(CID, events[:2], first_answer_at=at(395))["phases"]]
