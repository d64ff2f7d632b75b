"""The bus's permission tables and power-event signatures, as pure functions (no server)."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts import events as E
from levers9.runtime import nats_auth as A
from levers9.runtime import nats_jwt as J
from levers9.runtime.bus_signing import SIGNATURE_HEADER, SIGNER_HEADER, Signer, Verifier

workspaces = st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True)
ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True)
aggregates = st.sampled_from(A.subjects.AGGREGATES)
EVENT_TYPES = sorted({t.__name__ for t in E.AnyEvent.__args__})  # type: ignore[attr-defined]
types = st.sampled_from(EVENT_TYPES)


def subject(ws: str, agg: str, agg_id: str, etype: str) -> str:
    return f"levers9.{ws}.{agg}.{agg_id}.{etype}"


def test_the_power_and_outside_tables_name_real_event_types_and_do_not_overlap():
    assert set(A.POWER_OWNERS) <= set(EVENT_TYPES)
    assert set(A.OUTSIDE_TYPES) <= set(EVENT_TYPES)
    assert not set(A.POWER_OWNERS) & set(A.OUTSIDE_TYPES)
    for must in ("TokenCreated", "TokenRevoked", "SecretSet", "SecretDeleted", "WorkerRegistered",
                 "WorkerReady", "WorkerSlotReserved", "ContainerScheduled", "PlacementDeferred"):
        assert must in A.POWER_OWNERS


@given(ws=workspaces, other=workspaces, agg=aggregates, agg_id=ids, etype=types, pid=ids)
def test_a_publisher_writes_only_requests_into_its_own_workspace(ws, other, agg, agg_id, etype, pid):
    perms = A.publisher_permissions(ws, pid)
    allowed = A.may_publish(perms, subject(ws, agg, agg_id, etype))
    assert allowed == (etype in A.OUTSIDE_TYPES)
    if other != ws:
        assert not A.may_publish(perms, subject(other, agg, agg_id, etype))
    assert not A.may_publish(perms, subject("_sys", agg, agg_id, etype))
    for api in ("$JS.API.STREAM.DELETE.LEVERS9", "$JS.API.STREAM.PURGE.LEVERS9", "$KV.levers9_heartbeats.w1",
                "levers9dlq.levers9.x.y.z.T", f"$JS.API.CONSUMER.MSG.NEXT.LEVERS9.scheduler-{pid}"):
        assert not A.may_publish(perms, api)


@given(ws=workspaces, pid=ids, other=workspaces)
def test_a_publisher_audit_consumer_reads_only_its_workspace(ws, pid, other):
    perms = A.publisher_permissions(ws, pid)
    name = A.audit_consumer(ws, pid)
    assert A.may_publish(perms, f"$JS.API.CONSUMER.CREATE.LEVERS9.{name}.levers9.{ws}.>")
    if other != ws:
        assert not A.may_publish(perms, f"$JS.API.CONSUMER.CREATE.LEVERS9.{name}.levers9.{other}.>")
    assert not A.may_publish(perms, f"$JS.API.CONSUMER.CREATE.LEVERS9.{name}.levers9.>")
    assert not A.may_publish(perms, f"$JS.API.CONSUMER.CREATE.LEVERS9.{name}")  # no filter: everything


@given(wid=ids, other=ids, ws=workspaces, agg_id=ids, etype=types)
def test_a_worker_writes_its_own_worker_and_reports_but_no_power_it_does_not_own(wid, other, ws, agg_id, etype):
    perms = A.worker_permissions(wid)
    own = A.may_publish(perms, subject("_sys", "worker", wid, etype))
    assert own == A.owns(A.WORKER, etype)
    if other != wid:
        assert not A.may_publish(perms, subject("_sys", "worker", other, etype))
        assert not A.may_publish(perms, f"$KV.levers9_heartbeats.{other}")
    for agg in A.subjects.AGGREGATES:
        if A.may_publish(perms, subject(ws, agg, agg_id, etype)):
            assert etype in A.WORKER_TYPES.get(agg, ()) and etype not in A.POWER_OWNERS
    assert A.may_publish(perms, f"$KV.levers9_heartbeats.{wid}")
    assert not A.may_publish(perms, "$JS.API.STREAM.CREATE.LEVERS9")


@given(service=st.sampled_from(A.ROLES_SERVICES), etype=types, ws=workspaces, agg=aggregates, agg_id=ids)
def test_a_service_publishes_a_power_event_only_if_it_owns_it(service, etype, ws, agg, agg_id):
    perms = A.service_permissions(service)
    assert A.may_publish(perms, subject(ws, agg, agg_id, etype)) == A.owns(service, etype)
    assert not A.may_publish(perms, "$JS.API.STREAM.DELETE.LEVERS9")
    assert A.may_publish(perms, "$JS.API.STREAM.CREATE.LEVERS9")


def test_every_user_subscribes_only_to_its_own_inbox():
    tables = {"pool-controller": A.service_permissions("pool-controller"), "w_a": A.worker_permissions("a"),
              "p_w_1": A.publisher_permissions("w", "1")}
    for tag, perms in tables.items():
        assert perms["sub"]["allow"] == [f"_INBOX_{tag}.>"]
    # the scheduler's autoscaler reads the gateways' load samples (core NATS, never the log); only
    # gateways publish them
    assert A.service_permissions("scheduler")["sub"]["allow"] == ["_INBOX_scheduler.>", "levers9load.>"]
    assert A.may_publish(A.service_permissions("gateway"), "levers9load.g1")
    assert not A.may_publish(A.service_permissions("scheduler"), "levers9load.g1")
    assert not A.may_publish(A.worker_permissions("a"), "levers9load.g1")
    # the gateway also answers the pool controller's cluster requests (core NATS, never the log)
    assert A.service_permissions("gateway")["sub"]["allow"] == ["_INBOX_gateway.>", "levers9rpc.cluster.>"]


@pytest.mark.parametrize(("pattern", "subj", "hit"), [
    ("levers9.*.*.*.TokenCreated", "levers9.a.token.x.TokenCreated", True),
    ("levers9.*.*.*.TokenCreated", "levers9.a.token.x.TokenRevoked", False),
    ("levers9.>", "levers9", False), ("levers9.>", "levers9.a", True), ("a.*", "a.b.c", False),
])
def test_subject_matching_follows_nats(pattern, subj, hit):
    assert A.matches(pattern, subj) is hit


def test_user_jwts_carry_the_permissions_and_verify_only_untampered():
    account = J.new_seed("account")
    user = J.new_seed("user")
    perms = A.publisher_permissions("w", "1")
    token = J.user_jwt(account, J.public_key(account), J.public_key(user), "p_w_1", perms)
    claims = J.decode(token)
    assert claims["nats"]["pub"] == perms["pub"] and claims["sub"] == J.public_key(user)
    head, body, sig = token.split(".")
    forged = body.replace(body[10], "A" if body[10] != "A" else "B", 1)
    with pytest.raises(ValueError):
        J.decode(f"{head}.{forged}.{sig}")
    assert J.creds_jwt(J.creds(token, user)) == token


def _signed(role: str, subj: str, payload: bytes) -> tuple[dict[str, str], Verifier]:
    signers = {r: Signer(r, J.new_seed("user")) for r in ("gateway", "scheduler", "worker", "admin")}
    verifier = Verifier({r: J.public_key(s.seed) for r, s in signers.items()})
    return signers[role].headers(subj, payload), verifier


def test_power_events_are_accepted_only_signed_by_an_owner():
    subj, payload = "levers9.default.token.t1.TokenCreated", b'{"x":1}'
    headers, verifier = _signed("gateway", subj, payload)
    assert headers[SIGNER_HEADER] == "gateway"
    assert verifier.reject(subj, payload, headers) is None
    assert "unsigned" in verifier.reject(subj, payload, {})
    assert "does not verify" in verifier.reject(subj, payload + b" ", headers)
    assert "does not verify" in verifier.reject(subj.replace("default", "other"), payload, headers)
    bad = {**headers, SIGNATURE_HEADER: base64.b64encode(b"\0" * 64).decode()}
    assert "does not verify" in verifier.reject(subj, payload, bad)
    # the scheduler's key is real, but it does not own tokens; and it signs nothing it does not own
    sched_headers, verifier = _signed("scheduler", subj, payload)
    assert sched_headers == {}
    lied = {**headers, SIGNER_HEADER: "scheduler"}
    assert "does not own" in verifier.reject(subj, payload, lied)
    # not a power event: no signature needed
    assert verifier.reject("levers9.default.container.c1.ContainerRequested", payload, {}) is None
