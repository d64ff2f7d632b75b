"""Power events carry the signature of the service that owns them; consumers check it.

Server permissions already refuse a power event from anyone but its owner (nats_auth.py). This is
the second check, for whatever reaches the stream anyway (a mis-set permission, a server that runs
without auth, a replayed or copied message): the owning service signs `subject + "\n" + payload`
with its ed25519 key (an nkey seed only it holds) in the `Levers9-Signer` / `Levers9-Signature`
headers, and every consumer dead-letters a power event whose signature is missing, made by a role
that does not own the type, or does not verify. Events that are not power events are not signed.

Container reports (ContainerStarted/Ready/Stopped/Failed, and CheckpointDumped: what a worker says
about a container it runs) are bound to the ONE worker that sends them, since NATS cannot limit a worker's user to
container ids it does not know yet: the worker signs each report with its own NATS user key and
sends the user JWT beside it (`Levers9-Reporter` / `Levers9-Reporter-Signature`). A consumer that
knows the account's issuing key (`@issuer` in signers.json) accepts a report only when the JWT was
issued by that key to worker W (user name `w_<W>`), the signature verifies under the JWT's key, and
the report's `worker_id` is W. Whether W is the worker the container was placed on is the
projection's check (views.ContainersView ignores a report from any other worker).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import nkeys

from . import nats_auth
from .nats_jwt import creds_jwt, decode, public_key, verify

SIGNER_HEADER = "Levers9-Signer"
SIGNATURE_HEADER = "Levers9-Signature"
REPORTER_HEADER = "Levers9-Reporter"  # the reporting worker's NATS user JWT
REPORTER_SIGNATURE_HEADER = "Levers9-Reporter-Signature"
ISSUER_KEY = "@issuer"  # signers.json: the account key that issues every user JWT
# a dump names its worker too (the checkpoint-store then checks the container is placed there)
REPORT_TYPES = frozenset((*nats_auth.WORKER_TYPES["container"], "CheckpointDumped"))


def _signed_bytes(subject: str, payload: bytes) -> bytes:
    return subject.encode() + b"\n" + payload


def event_type_of(subject: str) -> str:
    return subject.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Signer:
    role: str
    seed: str = field(repr=False)

    def headers(self, subject: str, payload: bytes) -> dict[str, str]:
        """The signature headers for a power event this role owns (the admin: also container
        reports, as the operator's tools may write any event); {} for any other event."""
        event_type = event_type_of(subject)
        admin_report = self.role == nats_auth.ADMIN and event_type in REPORT_TYPES
        if not admin_report and (event_type not in nats_auth.POWER_OWNERS or not nats_auth.owns(self.role, event_type)):
            return {}
        sig = nkeys.from_seed(bytearray(self.seed.encode())).sign(_signed_bytes(subject, payload))
        return {SIGNER_HEADER: self.role, SIGNATURE_HEADER: base64.b64encode(sig).decode()}

    @classmethod
    def load(cls, path: str | Path) -> "Signer":
        data = json.loads(Path(path).read_text())
        return cls(role=data["role"], seed=data["seed"])

    def dump(self) -> str:
        return json.dumps({"role": self.role, "seed": self.seed, "public_key": public_key(self.seed)})


@dataclass(frozen=True)
class Reporter:
    """A worker's own identity for its container reports: its NATS user JWT and that user's seed."""
    jwt: str
    seed: str = field(repr=False)

    def headers(self, subject: str, payload: bytes) -> dict[str, str]:
        if event_type_of(subject) not in REPORT_TYPES:
            return {}
        sig = nkeys.from_seed(bytearray(self.seed.encode())).sign(_signed_bytes(subject, payload))
        return {REPORTER_HEADER: self.jwt, REPORTER_SIGNATURE_HEADER: base64.b64encode(sig).decode()}

    @classmethod
    def from_creds(cls, path: str | Path) -> "Reporter":
        text = Path(path).read_text()
        lines = [ln.strip() for ln in text.splitlines()]
        seed = lines[lines.index("-----BEGIN USER NKEY SEED-----") + 1]
        return cls(jwt=creds_jwt(text), seed=seed)


def reporter_of(jwt: str, issuer: str) -> str:
    """The worker id a report's JWT names, after checking the account issued it; raises ValueError."""
    claims = decode(jwt)  # checks the JWT's own signature against the issuer it names
    if claims.get("iss") != issuer:
        raise ValueError("its JWT was not issued by this platform's account")
    name = str(claims.get("name", ""))
    if not name.startswith("w_"):
        raise ValueError(f"its JWT belongs to {name!r}, not to a worker")
    return name[2:]


def report_rejection(subject: str, payload: bytes, headers: dict[str, str], issuer: str) -> str | None:
    """Why a container report must not be applied, or None: signed by the worker it names."""
    event_type = event_type_of(subject)
    jwt, sig = headers.get(REPORTER_HEADER, ""), headers.get(REPORTER_SIGNATURE_HEADER, "")
    if not jwt or not sig:
        return f"unsigned container report {event_type}: only the worker that runs the container may send it"
    try:
        worker = reporter_of(jwt, issuer)
        claims = decode(jwt)
        raw = base64.b64decode(sig, validate=True)
        named = msgspec.json.decode(payload).get("data", {}).get("worker_id", "")
    except (ValueError, KeyError, AttributeError, binascii.Error, msgspec.DecodeError) as exc:
        return f"container report {event_type}: bad reporter: {exc}"
    if not verify(claims["sub"], _signed_bytes(subject, payload), raw):
        return f"container report {event_type}: the signature of worker {worker!r} does not verify"
    if named != worker:
        return f"container report {event_type} names worker {named!r} but was sent by worker {worker!r}"
    return None


@dataclass(frozen=True)
class Verifier:
    keys: dict[str, str]  # role -> its public nkey

    def reject(self, subject: str, payload: bytes, headers: dict[str, str]) -> str | None:
        """Why this message must not be applied, or None when it may (not a power event, or
        signed by a role that owns its type)."""
        event_type = event_type_of(subject)
        owners = nats_auth.POWER_OWNERS.get(event_type)
        if owners is None:
            issuer = self.keys.get(ISSUER_KEY)
            if not issuer or event_type not in REPORT_TYPES:
                return None
            if headers.get(SIGNER_HEADER) == nats_auth.ADMIN:  # the operator's tools
                return self._signature_rejection(subject, payload, headers, nats_auth.ADMIN, f"report {event_type}")
            return report_rejection(subject, payload, headers, issuer)
        expected = ", ".join(sorted(owners | {nats_auth.ADMIN}))
        role, sig = headers.get(SIGNER_HEADER, ""), headers.get(SIGNATURE_HEADER, "")
        if not role or not sig:
            return f"unsigned power event {event_type}: only {expected} may publish it, signed"
        if not nats_auth.owns(role, event_type):
            return f"power event {event_type} signed by {role!r}, which does not own it (owners: {expected})"
        return self._signature_rejection(subject, payload, headers, role, f"power event {event_type}")

    def _signature_rejection(self, subject: str, payload: bytes, headers: dict[str, str], role: str,
                             what: str) -> str | None:
        key = self.keys.get(role)
        if key is None:
            return f"{what} signed by {role!r}, whose key this service does not know"
        try:
            raw = base64.b64decode(headers.get(SIGNATURE_HEADER, ""), validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if not verify(key, _signed_bytes(subject, payload), raw):
            return f"{what}: the signature of {role!r} does not verify"
        return None

    @classmethod
    def load(cls, path: str | Path) -> "Verifier":
        return cls(keys=dict(json.loads(Path(path).read_text())))
