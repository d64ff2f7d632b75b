"""Contracts: every event round-trips, unknown fields are ignored, old versions upcast, subjects
cannot be forged. Pure: no servers."""

from __future__ import annotations

import json
import uuid

import pytest
from contracts_strategies import any_event, ids, text, workspaces
from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.contracts import (
    EVENT_TYPES,
    ContractError,
    InvalidName,
    check_id,
    check_workspace,
    decode,
    encode,
    envelope,
    subjects,
    uuid7,
)
from levers9.contracts import events as E
from levers9.contracts.examples import example_envelope
from levers9.contracts.schema import event_schema
from levers9.contracts.upcasting import upcast


@settings(max_examples=400, deadline=None)
@given(event=any_event(), workspace=workspaces)
def test_every_event_round_trips_through_the_envelope(event, workspace):
    env = envelope(event, workspace=workspace)
    msg = decode(encode(env), env.subject)
    assert msg.event == event
    assert msg.envelope == env
    expected_ws = "_sys" if event.SYSTEM else workspace
    assert msg.subject == f"levers9.{expected_ws}.{event.AGGREGATE}.{event.aggregate_id}.{type(event).__name__}"


@settings(max_examples=200, deadline=None)
@given(event=any_event(), extra=st.dictionaries(st.from_regex(r"\Azz_[a-z]{1,8}\Z"), st.integers() | text,
                                                min_size=1, max_size=3))
def test_unknown_fields_are_ignored_in_envelope_and_body(event, extra):
    doc = json.loads(encode(envelope(event, workspace="acme")))
    doc["data"].update(extra)
    doc.update(extra)
    assert decode(json.dumps(doc).encode()).event == event


@settings(max_examples=200, deadline=None)
@given(cpu=st.floats(min_value=0.001, max_value=128, allow_nan=False), memory=st.integers(16, 1 << 20),
       cid=ids)
def test_container_requested_v1_upcasts_to_the_current_version(cpu, memory, cid):
    v1 = {"id": uuid7(), "type": "ContainerRequested", "version": 1, "occurred_at": "2026-01-01T00:00:00Z",
          "workspace": "acme", "correlation_id": "c", "data": {"container_id": cid, "cpu": cpu, "memory": memory}}
    event = decode(json.dumps(v1).encode()).event
    assert isinstance(event, E.ContainerRequested)
    assert event.resources.cpu_millicores == round(cpu * 1000)
    assert event.resources.memory_mib == memory


def test_a_version_newer_than_the_code_is_rejected_with_the_reason():
    env = json.loads(encode(example_envelope("ContainerRequested")))
    env["version"] = 9
    with pytest.raises(ContractError, match="newer than this build"):
        decode(json.dumps(env).encode())
    with pytest.raises(Exception, match="no upcaster"):
        upcast("ContainerStarted", 1, 2, {})


@pytest.mark.parametrize("bad", ["", "a.b", "a*", ">", "a b", "a>b", "-x", "x" * 200, "é", "a\n"])
def test_ids_that_could_forge_a_subject_are_refused(bad):
    with pytest.raises(InvalidName):
        check_id(bad)
    with pytest.raises(InvalidName):
        check_workspace(bad)
    with pytest.raises((InvalidName, ContractError)):
        envelope(E.ContainerRequested(container_id=bad), workspace="acme")


@pytest.mark.parametrize("ws", ["Acme", "ac.me", "*", "_sys2", "a_b"])
def test_bad_workspaces_are_refused(ws):
    with pytest.raises(InvalidName):
        envelope(E.ContainerRequested(container_id="c1"), workspace=ws)


def test_platform_events_live_in_sys_and_tenant_events_cannot():
    env = envelope(E.WorkerReady(worker_id="w1"), workspace="acme")
    assert env.workspace == "_sys"
    doc = json.loads(encode(envelope(E.ContainerRequested(container_id="c1"), workspace="acme")))
    doc["workspace"] = "_sys"
    with pytest.raises(ContractError, match="_sys"):
        decode(json.dumps(doc).encode())


@pytest.mark.parametrize("payload,reason", [
    (b"{", "does not decode"),
    (b'{"id": "x"}', "does not decode"),
    (json.dumps({"id": "not-a-uuid", "type": "ContainerRequested", "version": 2, "occurred_at": "t",
                 "workspace": "acme", "correlation_id": "c", "data": {"container_id": "c1"}}).encode(), "UUID"),
    (json.dumps({"id": str(uuid.uuid4()), "type": "Nope", "version": 1, "occurred_at": "t",
                 "workspace": "acme", "correlation_id": "c", "data": {}}).encode(), "unknown event type"),
    (json.dumps({"id": str(uuid.uuid4()), "type": "ContainerRequested", "version": 2, "occurred_at": "t",
                 "workspace": "acme", "correlation_id": "c", "data": {"cpu_millicores": 1}}).encode(), "not valid"),
    (json.dumps({"id": str(uuid.uuid4()), "type": "ContainerRequested", "version": 2, "occurred_at": "t",
                 "workspace": "acme", "correlation_id": "c", "data": {"container_id": "a.b"}}).encode(), "not valid"),
])
def test_malformed_messages_say_why(payload, reason):
    with pytest.raises(ContractError, match=reason):
        decode(payload)


def test_subject_must_match_the_envelope():
    env = envelope(E.ContainerRequested(container_id="c1"), workspace="acme")
    with pytest.raises(ContractError, match="does not match"):
        decode(encode(env), "levers9.other.container.c1.ContainerRequested")


def test_uuid7_is_time_ordered_and_version_7():
    values = [uuid7() for _ in range(2000)]
    assert values == sorted(values)
    assert len(set(values)) == len(values)
    assert all(uuid.UUID(v).version == 7 for v in values)


@given(ws=st.none() | workspaces, agg=st.none() | st.sampled_from(subjects.AGGREGATES), aid=st.none() | ids,
       et=st.none() | st.sampled_from(sorted(EVENT_TYPES)))
def test_filter_subjects_have_five_tokens_and_no_widening(ws, agg, aid, et):
    f = subjects.filter_subject(ws, agg, aid, et)
    tokens = f.split(".")
    assert len(tokens) == 5 and tokens[0] == "levers9" and ">" not in f


def test_parse_is_the_inverse_of_subject():
    s = subjects.subject("acme", "container", "c-1", "ContainerReady")
    assert str(subjects.parse(s)) == s
    with pytest.raises(InvalidName):
        subjects.parse("levers9.acme.container.c1")


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_every_event_has_a_schema_and_a_valid_example(name):
    schema = event_schema(EVENT_TYPES[name])
    assert schema["properties"]["type"] == {"const": name}
    assert "type" not in schema["properties"]["data"]["properties"]
    env = example_envelope(name)
    assert decode(encode(env), env.subject).envelope.type == name
