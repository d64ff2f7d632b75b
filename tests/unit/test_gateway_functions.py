"""The pure parts of function calls in the gateway and the worker's relay."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts.proto import functions_pb2 as pb
from levers9.contracts.spec import decode_spec
from levers9.executor.wire import parse_relay_address as parse_address
from levers9.executor.wire import relay_address
from levers9.gateway.executor_client import Outcome, relay_target
from levers9.gateway.function_calls import BACKOFF_MAX_S, backoff
from levers9.gateway.function_plans import executor_header
from levers9.gateway.function_targets import TargetError, adhoc_spec
from levers9.gateway.routes_functions import arguments
from levers9.gateway.state import Deployment
from levers9.worker.sandboxes.executor_relay import Relay
from levers9.worker.sandboxes.sandboxes import generation_refusal

SPEC = {"name": "zscore", "app_name": "stats", "code": {"kind": "function", "module": "stats", "handler": "zscore"},
        "resources": {"cpu_millicores": 500, "memory_mib": 256}, "function": {"retries": 2, "packages": ["humanize"]}}


def test_an_adhoc_sandbox_is_named_by_its_spec_and_fetches_no_code():
    a = adhoc_spec(json.dumps(SPEC), "zscore")
    assert a.name.startswith("fn-") and a.code.module == "" and a.code.key == "" and a.code.kind == "function"
    assert adhoc_spec(json.dumps(SPEC), "zscore").name == a.name  # same options, same sandboxes
    other = {**SPEC, "resources": {"cpu_millicores": 1000, "memory_mib": 256}}
    assert adhoc_spec(json.dumps(other), "zscore").name != a.name
    assert a.function is not None and a.function.retries == 2


def test_a_bad_adhoc_spec_is_an_invalid_argument_naming_the_field():
    with pytest.raises(TargetError) as info:
        adhoc_spec(json.dumps({**SPEC, "resources": {"memory_mib": 1}}), "zscore")
    assert info.value.code == "INVALID_ARGUMENT" and "memory_mib" in str(info.value)


def deployment(spec: dict) -> Deployment:
    return Deployment(workspace="w", deployment_id="zscore-v1", name="zscore", version=1, status="active",
                      spec=decode_spec(json.dumps(spec)))


def test_the_executor_header_names_a_deployed_function_or_the_pickled_one():
    dep = deployment(SPEC)
    header = executor_header(dep, pb.FunctionRef(app="stats", name="zscore"), "")
    assert header["function"] == {"module": "stats", "qualname": "zscore"} and header["packages"] == ["humanize"]
    pickled = executor_header(dep, pb.FunctionRef(pickled=b"x" * 10, packages=["six"], generator=True), "s1")
    assert pickled["function"] == {"pickled": 10} and pickled["packages"] == ["six"]
    assert pickled["generator"] and pickled["session"] == "s1" and pickled["timeout"] == 180.0


def test_rest_arguments():
    assert json.loads(arguments(b"")) == {"args": [], "kwargs": {}}
    assert json.loads(arguments(b'{"args": [1, 2]}')) == {"args": [1, 2], "kwargs": {}}
    assert json.loads(arguments(b'{"xs": [1]}')) == {"args": [], "kwargs": {"xs": [1]}}
    for bad in (b"[1]", b"{nope", b'{"args": 3}'):
        with pytest.raises(Exception) as info:
            arguments(bad)
        assert getattr(info.value, "status_code", 0) == 422


@pytest.mark.parametrize("outcome, kind", [
    (Outcome(ok=True), "ok"), (Outcome(ok=False, error_type="ValueError"), "error"),
    (Outcome(ok=False, reason="cancelled"), "cancelled"), (Outcome(ok=False, reason="timed out after 3 s"), "timeout"),
    (Outcome(ok=False, reason="the sandbox died mid-call: OOM"), "failed")])
def test_outcome_kinds(outcome, kind):
    assert outcome.kind == kind


@given(st.integers(min_value=1, max_value=50))
def test_backoff_grows_and_is_capped(n):
    assert 0 < backoff(n) <= BACKOFF_MAX_S and backoff(n + 1) >= backoff(n)


def test_a_relay_address_round_trips_and_its_key_opens_one_container():
    relay = Relay(lambda cid: None)
    address = relay_address("10.0.0.5", 4000, "c1", relay.key("c1"))
    assert parse_address(address) == ("10.0.0.5", 4000, "c1", relay.key("c1"))
    host, port, line = relay_target(address)
    assert (host, port) == ("10.0.0.5", 4000) and json.loads(line) == {"container_id": "c1", "key": relay.key("c1")}
    assert relay.key("c1") != relay.key("c2") and relay.key("c1") != Relay(lambda cid: None).key("c1")
    with pytest.raises(ValueError):
        relay_target("http://10.0.0.5:8000")


def test_a_worker_refuses_an_executor_generation_it_does_not_speak():
    assert generation_refusal(decode_spec(json.dumps(SPEC))) == ""
    newer = {**SPEC, "function": {"executor_generation": 99}}
    assert "generation 99" in generation_refusal(decode_spec(json.dumps(newer)))
