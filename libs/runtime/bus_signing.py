"""Power events carry the signature of the service that owns them; consumers check it.

Server permissions already refuse a power event from anyone but its owner (nats_auth.py). This is
the second check, for whatever reaches the stream anyway (a mis-set permission, a server that runs
without auth, a replayed or copied message): the owning service signs `subject + "\n" + payload`
with its ed25519 key (an nkey seed only it holds) in the `Levers9-Signer` / `Levers9-Signature`
headers, and every consumer dead-letters a power event whose signature is missing, made by a role
that does not own the type, or does not verify. Events that are not power events are not signed.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from pathlib import Path

import nkeys

from . import nats_auth
from .nats_jwt import public_key, verify

SIGNER_HEADER = "Levers9-Signer"
SIGNATURE_HEADER = "Levers9-Signature"


def _signed_bytes(subject: str, payload: bytes) -> bytes:
    return subject.encode() + b"\n" + payload


def event_type_of(subject: str) -> str:
    return subject.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Signer:
    role: str
    seed: str = field(repr=False)

    def headers(self, subject: str, payload: bytes) -> dict[str, str]:
        """The signature headers for a power event this role owns; {} for any other event."""
        event_type = event_type_of(subject)
        if event_type not in nats_auth.POWER_OWNERS or not nats_auth.owns(self.role, event_type):
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
class Verifier:
    keys: dict[str, str]  # role -> its public nkey

    def reject(self, subject: str, payload: bytes, headers: dict[str, str]) -> str | None:
        """Why this message must not be applied, or None when it may (not a power event, or
        signed by a role that owns its type)."""
        event_type = event_type_of(subject)
        owners = nats_auth.POWER_OWNERS.get(event_type)
        if owners is None:
            return None
        expected = ", ".join(sorted(owners | {nats_auth.ADMIN}))
        role, sig = headers.get(SIGNER_HEADER, ""), headers.get(SIGNATURE_HEADER, "")
        if not role or not sig:
            return f"unsigned power event {event_type}: only {expected} may publish it, signed"
        if not nats_auth.owns(role, event_type):
            return f"power event {event_type} signed by {role!r}, which does not own it (owners: {expected})"
        key = self.keys.get(role)
        if key is None:
            return f"power event {event_type} signed by {role!r}, whose key this service does not know"
        try:
            raw = base64.b64decode(sig, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if not verify(key, _signed_bytes(subject, payload), raw):
            return f"power event {event_type}: the signature of {role!r} does not verify"
        return None

    @classmethod
    def load(cls, path: str | Path) -> "Verifier":
        return cls(keys=dict(json.loads(Path(path).read_text())))
