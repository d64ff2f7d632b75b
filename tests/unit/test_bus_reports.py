"""Container reports are bound to the worker that sends them: signed with that worker's own NATS user
key, its JWT issued by the platform's account, naming the worker the report names. The scheduler's
fold ignores a report from any worker but the one the container is placed on."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts import encode, envelope
from levers9.contracts import events as E
from levers9.runtime.bus_signing import (
    ISSUER_KEY,
    REPORTER_HEADER,
    REPORTER_SIGNATURE_HEADER,
    Reporter,
    Verifier,
)
from levers9.runtime.nats_issuer import Issuer
from levers9.runtime.views import foreign_report


@pytest.fixture(scope="module")
def issuer(tmp_path_factory):
    iss = Issuer(tmp_path_factory.mktemp("auth"))
    iss.ensure()
    return iss


def report(worker_id: str, container_id: str = "c1", address: str = "http://10.0.0.2:8000"):
    env = envelope(E.ContainerReady(container_id=container_id, worker_id=worker_id, address=address),
                   workspace="acme")
    return env.subject, encode(env)


def verifier(iss: Issuer) -> Verifier:
    return Verifier.load(iss.signers_path)


def test_signers_name_the_issuing_key(issuer):
    assert json.loads(issuer.signers_path.read_text())[ISSUER_KEY].startswith("A")


def test_a_report_signed_by_the_worker_it_names_is_accepted(issuer):
    me = Reporter.from_creds(issuer.worker_creds("w1"))
    subject, payload = report("w1")
    assert verifier(issuer).reject(subject, payload, me.headers(subject, payload)) is None


def test_an_unsigned_report_is_rejected_when_the_issuer_is_known(issuer):
    subject, payload = report("w1")
    assert "unsigned container report" in verifier(issuer).reject(subject, payload, {})
    # a consumer that does not know the issuer (NATS without auth) checks nothing
    assert Verifier(keys={}).reject(subject, payload, {}) is None


def test_a_worker_cannot_report_as_another_worker(issuer):
    w2 = Reporter.from_creds(issuer.worker_creds("w2"))
    subject, payload = report("w1")
    why = verifier(issuer).reject(subject, payload, w2.headers(subject, payload))
    assert why and "names worker 'w1' but was sent by worker 'w2'" in why


def test_a_tampered_report_or_a_borrowed_jwt_does_not_verify(issuer):
    w1 = Reporter.from_creds(issuer.worker_creds("w1"))
    subject, payload = report("w1")
    headers = w1.headers(subject, payload)
    _, other = report("w1", address="http://attacker:1")
    assert "does not verify" in verifier(issuer).reject(subject, other, headers)
    # w1's JWT with another key's signature (the JWT is public: it travels in every report)
    w3 = Reporter.from_creds(issuer.worker_creds("w3"))
    forged = {REPORTER_HEADER: w1.jwt, REPORTER_SIGNATURE_HEADER: w3.headers(subject, payload)[REPORTER_SIGNATURE_HEADER]}
    assert "does not verify" in verifier(issuer).reject(subject, payload, forged)


def test_a_jwt_from_another_platform_or_of_a_non_worker_is_refused(issuer, tmp_path):
    stranger = Issuer(tmp_path / "other")
    stranger.ensure()
    theirs = Reporter.from_creds(stranger.worker_creds("w1"))
    subject, payload = report("w1")
    assert "not issued by this platform" in verifier(issuer).reject(subject, payload, theirs.headers(subject, payload))
    gateway = Reporter.from_creds(issuer.creds_path("gateway"))
    assert "not to a worker" in verifier(issuer).reject(subject, payload, gateway.headers(subject, payload))
    bad = {REPORTER_HEADER: "x.y.z", REPORTER_SIGNATURE_HEADER: base64.b64encode(b"0" * 64).decode()}
    assert "bad reporter" in verifier(issuer).reject(subject, payload, bad)


def test_only_container_reports_are_signed_by_the_reporter(issuer):
    me = Reporter.from_creds(issuer.worker_creds("w1"))
    env = envelope(E.ContainerRequested(container_id="c1"), workspace="acme")
    assert me.headers(env.subject, encode(env)) == {}


ids = st.sampled_from(["", "w1", "w2"])


@given(placed=ids, reporter=ids)
def test_a_report_changes_a_container_only_when_it_comes_from_where_the_container_is_placed(placed, reporter):
    ready = E.ContainerReady(container_id="c1", worker_id=reporter, address="http://x:1")
    assert foreign_report(placed, ready) == bool(placed and reporter and placed != reporter)
    # the placement itself always applies: it is what moves a container to another worker
    assert not foreign_report(placed, E.ContainerScheduled(container_id="c1", worker_id=reporter or "w9"))


def test_the_admin_may_write_a_report_signed_with_its_key_and_nobody_may_borrow_its_name(issuer):
    from levers9.runtime.bus_signing import SIGNATURE_HEADER, SIGNER_HEADER, Signer

    admin = Signer.load(issuer.signing_path("admin"))
    subject, payload = report("w1")
    assert verifier(issuer).reject(subject, payload, admin.headers(subject, payload)) is None
    gateway = Signer.load(issuer.signing_path("gateway"))
    assert gateway.headers(subject, payload) == {}  # a service writes no container report
    forged = {SIGNER_HEADER: "admin", SIGNATURE_HEADER: Signer("admin", gateway.seed).headers(subject, payload)[
        SIGNATURE_HEADER]}
    assert "does not verify" in verifier(issuer).reject(subject, payload, forged)
