"""The event API's pure rules: who reads which event (isolation first), what of it, the list's query
and its SQL, the stream's resume point and framing, the calls filter and the stats' arithmetic."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts import SYSTEM_WORKSPACE, decode, encode, envelope
from levers9.contracts import events as E
from levers9.gateway.event_rules import (
    EVERYONE,
    BadQuery,
    EventQuery,
    audience,
    audiences,
    event_json,
    list_sql,
    parse_query,
    readable,
    resume_point,
    sse,
)
from levers9.gateway.routes_calls import calls_filter
from levers9.gateway.routes_stats import cold_kind, minute_series, percentile

workspaces = st.from_regex(r"[a-z0-9][a-z0-9-]{0,10}", fullmatch=True)
WORKER_TYPES = [t for t, cls in E.EVENT_TYPES.items() if cls.AGGREGATE == "worker"]


# ---- isolation ------------------------------------------------------------------------------------

@given(owner=workspaces, reader=workspaces, aggregate=st.sampled_from(["container", "call", "deployment", "secret"]))
def test_a_workspace_reads_no_other_workspaces_event(owner, reader, aggregate):
    who = audience(owner, aggregate, "X", {})
    assert readable(who, reader) == (owner == reader)


@given(reader=workspaces, other=workspaces, event_type=st.sampled_from(WORKER_TYPES))
def test_worker_events_name_no_other_workspace(reader, other, event_type):
    """A slot reservation is its container's workspace's; a release (whose workspace it does not say)
    nobody's; the rest every workspace's, as the workers list is."""
    who = audience(SYSTEM_WORKSPACE, "worker", event_type, {"workspace": other})
    if event_type == "WorkerSlotReserved":
        assert readable(who, reader) == (reader == other)
    elif event_type == "WorkerSlotReleased":
        assert who == "" and not readable(who, reader)
    else:
        assert who == EVERYONE and readable(who, reader)


@given(reader=workspaces, cluster=workspaces, owned=st.booleans())
def test_an_attached_clusters_workers_are_its_owners(reader, cluster, owned):
    provisioned = audience(SYSTEM_WORKSPACE, "worker", "WorkerProvisioned", {"cluster": cluster})
    later = audience(SYSTEM_WORKSPACE, "worker", "WorkerReady", {}, worker_cluster=cluster)
    clusters = frozenset({cluster}) if owned else frozenset()
    assert provisioned == later == f"cluster:{cluster}"
    assert readable(later, reader, clusters) == owned
    assert set(audiences(reader, clusters)) == {reader, EVERYONE, *(f"cluster:{c}" for c in clusters)}


def test_other_platform_events_and_empty_audiences_are_nobodys():
    assert audience(SYSTEM_WORKSPACE, "catalogue", "CatalogueBuilt", {}) == ""
    assert not readable("", "")


def message(event, workspace="acme", **kw):
    env = envelope(event, workspace=workspace, **kw)
    return decode(encode(env), env.subject)


def test_secrets_and_token_hashes_are_redacted():
    secret = event_json(7, message(E.SecretSet(name="db", ciphertext="sealed")))
    token = event_json(8, message(E.TokenCreated(token_id="t1", token_sha256="ab" * 32, name="ci")))
    fenced = event_json(9, message(E.WorkerFenced(worker_id="w1", containers=["c1"]), SYSTEM_WORKSPACE))
    assert "ciphertext" not in secret["data"] and secret["data"]["name"] == "db"
    assert "token_sha256" not in token["data"] and token["data"]["name"] == "ci"
    assert "containers" not in fenced["data"]


def test_event_json_is_the_contracts_shape():
    event = event_json(123, message(E.ContainerReady(container_id="c1", worker_id="w1", address="http://a:1"),
                                    correlation_id="corr"))
    assert set(event) == {"seq", "id", "type", "version", "occurred_at", "workspace", "aggregate", "aggregate_id",
                          "correlation_id", "causation_id", "data"}
    assert (event["seq"], event["type"], event["aggregate"], event["aggregate_id"]) == (123, "ContainerReady",
                                                                                       "container", "c1")
    assert event["occurred_at"].endswith("Z") and event["correlation_id"] == "corr"
    assert "type" not in event["data"] and event["data"]["address"] == "http://a:1"
    frame = sse(event)
    assert frame.startswith("id: 123\nevent: ContainerReady\ndata: {") and frame.endswith("}\n\n")
    assert json.loads(frame.split("data: ", 1)[1]) == event


# ---- the list's query -----------------------------------------------------------------------------

@pytest.mark.parametrize(("params", "says"), [
    ({"type": "ContainerReady,Nope"}, "unknown event type 'Nope'"),
    ({"aggregate": "planet"}, "unknown aggregate"),
    ({"since": "yesterday"}, "not an ISO 8601 time"),
    ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since must be before until"),
    ({"limit": "0"}, "between 1 and 1000"),
    ({"limit": "1001"}, "between 1 and 1000"),
    ({"limit": "ten"}, "not a whole number"),
    ({"before": "-3"}, "between 1"),
    ({"correlation_id": "x" * 201}, "longer than 200"),
])
def test_bad_queries_say_what_is_wrong(params, says):
    with pytest.raises(BadQuery, match=says):
        parse_query(params)


def test_a_query_parses():
    q = parse_query({"type": "ContainerReady, ContainerFailed", "aggregate": "container", "aggregate_id": "c1",
                     "since": "2026-01-01T00:00:00", "until": "2026-01-02T00:00:00+02:00", "before": "99",
                     "limit": "5", "correlation_id": "k"})
    assert q.types == ("ContainerReady", "ContainerFailed") and q.before == 99 and q.limit == 5
    assert q.since == dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)  # no zone: UTC
    assert parse_query({}) == EventQuery()


@given(types=st.lists(st.sampled_from(sorted(E.EVENT_TYPES)), max_size=3, unique=True), aggregate=st.booleans(),
       before=st.integers(0, 10**12), limit=st.integers(1, 1000), since=st.booleans())
def test_list_sql_binds_every_value_and_interpolates_none(types, aggregate, before, limit, since):
    q = EventQuery(types=tuple(types), aggregate="container" if aggregate else "", aggregate_id="x'; DROP",
                   before=before, limit=limit, since=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) if since else None)
    sql, args = list_sql(q)
    assert "DROP" not in sql and "container" not in sql  # values are bound, never written into the SQL
    assert args[-1] == limit + 1  # one more than asked: whether an older page exists
    assert max(int(n) for n in __import__("re").findall(r"\$(\d+)", sql)) == len(args) + 1  # $1: the audiences


def test_resume_point_prefers_last_event_id():
    assert resume_point("", "") is None
    assert resume_point("41", "7") == 41
    assert resume_point("", "7") == 7
    assert resume_point(" 0 ", "") == 0
    with pytest.raises(BadQuery, match="Last-Event-ID"):
        resume_point("abc", "")


# ---- calls and stats ------------------------------------------------------------------------------

def test_calls_filter():
    assert calls_filter({}) == ("", [], 100, 0)
    where, args, limit, offset = calls_filter({"status": "error", "function": "app.f", "limit": "5", "offset": "10"})
    assert args == ["error", "app.f"] and (limit, offset) == (5, 10) and "$2" in where and "$3" in where
    for bad in ({"status": "exploded"}, {"limit": "0"}, {"offset": "-1"}):
        with pytest.raises(BadQuery):
            calls_filter(bad)


def test_cold_kinds():
    own = frozenset({"ck1"})
    assert [cold_kind(r, own) for r in ("", "ck1", "catalogue-ck")] == ["cold", "restored", "shared checkpoint"]


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200), st.floats(0.01, 1.0))
def test_percentile_is_a_member_and_monotone(values, q):
    p = percentile(values, q)
    assert p in values and p <= (percentile(values, 1.0) or 0) and p >= (percentile(values, 0.0) or 0)
    assert percentile([], q) is None


@given(st.integers(1, 120), st.lists(st.tuples(st.integers(0, 200 * 60), st.sampled_from(["ok", "error"]),
                                               st.floats(0, 1e4, allow_nan=False)), max_size=100))
def test_minute_series_counts_each_call_in_the_window_once(minutes, calls):
    until = dt.datetime(2026, 1, 1, 12, 0, 30, tzinfo=dt.timezone.utc)
    timed = [(until - dt.timedelta(seconds=s), o, ms) for s, o, ms in calls]
    series = minute_series(until, minutes, timed)
    start = until.replace(second=0) - dt.timedelta(minutes=minutes - 1)
    assert len(series) == minutes and series[-1]["minute"] == "2026-01-01T12:00:00Z"
    assert sum(m["calls"] for m in series) == sum(1 for at, _, _ in timed if at >= start)
    assert all((m["p50_ms"] is None) == (m["calls"] == 0) for m in series)
