"""NATS decentralized auth, minted here: operator, account and user JWTs signed with nkeys (ed25519).

Why JWTs rather than a users file: the server trusts one operator and preloads one account; any
holder of the account's signing key can issue a user (a worker, a publisher) without the server
being told or reloaded. Only revocation changes the account JWT (its `revocations`), which the
launcher rewrites into the server config and applies with `nats-server --signal reload`.

The JWT format is nats-io/jwt v2: base64url(header).base64url(claims).base64url(ed25519 signature
of the first two parts); `jti` is the base32 SHA-512/256 of the claims without it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from typing import Any

import nkeys
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
UNLIMITED = -1


def new_seed(kind: str) -> str:
    """A fresh nkey seed: kind is operator | account | user."""
    prefix = {"operator": nkeys.PREFIX_BYTE_OPERATOR, "account": nkeys.PREFIX_BYTE_ACCOUNT,
              "user": nkeys.PREFIX_BYTE_USER}[kind]
    return nkeys.encode_seed(os.urandom(32), prefix).decode()


def public_key(seed: str) -> str:
    return nkeys.from_seed(bytearray(seed.encode())).public_key.decode()


def verify(public: str, data: bytes, signature: bytes) -> bool:
    """Does `signature` over `data` verify under the public nkey `public` (U..., A..., O...)?"""
    try:
        raw = base64.b32decode(public + "=" * (-len(public) % 8))
    except (ValueError, TypeError):
        return False
    if len(raw) != 35 or nkeys.crc16_checksum(raw[:-2]) != raw[-2:]:
        return False
    try:
        VerifyKey(raw[1:33]).verify(data, signature)
    except (BadSignatureError, ValueError, TypeError):
        return False
    return True


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode(claims: dict[str, Any], signer_seed: str) -> str:
    claims = {**claims, "jti": "", "iat": claims.get("iat") or int(time.time()),
              "iss": public_key(signer_seed)}
    digest = hashlib.new("sha512_256", json.dumps(claims, separators=(",", ":")).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    head = _b64(json.dumps(HEADER, separators=(",", ":")).encode())
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    sig = nkeys.from_seed(bytearray(signer_seed.encode())).sign(f"{head}.{body}".encode())
    return f"{head}.{body}.{_b64(sig)}"


def decode(token: str) -> dict[str, Any]:
    """The claims, after checking the signature against the issuer named in them."""
    head, body, sig = token.split(".")
    claims = json.loads(_unb64(body))
    if not verify(claims["iss"], f"{head}.{body}".encode(), _unb64(sig)):
        raise ValueError(f"JWT {claims.get('name')!r}: the signature of its issuer does not verify")
    return claims


def operator_jwt(operator_seed: str, name: str, system_account: str = "") -> str:
    nats: dict[str, Any] = {"type": "operator", "version": 2}
    if system_account:
        nats["system_account"] = system_account
    return encode({"name": name, "sub": public_key(operator_seed), "nats": nats}, operator_seed)


def account_jwt(operator_seed: str, account_pub: str, name: str, *, jetstream: bool,
                signing_keys: list[str] = (), revocations: dict[str, int] | None = None) -> str:  # type: ignore[assignment]
    limits: dict[str, Any] = {"subs": UNLIMITED, "data": UNLIMITED, "payload": UNLIMITED,
                              "imports": UNLIMITED, "exports": UNLIMITED, "wildcards": True,
                              "conn": UNLIMITED, "leaf": UNLIMITED}
    if jetstream:
        limits.update({"mem_storage": UNLIMITED, "disk_storage": UNLIMITED, "streams": UNLIMITED,
                       "consumer": UNLIMITED, "max_ack_pending": UNLIMITED, "mem_max_stream_bytes": 0,
                       "disk_max_stream_bytes": 0, "max_bytes_required": False})
    nats: dict[str, Any] = {"limits": limits, "default_permissions": {"pub": {}, "sub": {}},
                            "type": "account", "version": 2}
    if signing_keys:
        nats["signing_keys"] = list(signing_keys)
    if revocations:
        nats["revocations"] = dict(revocations)
    return encode({"name": name, "sub": account_pub, "nats": nats}, operator_seed)


def user_jwt(signing_seed: str, account_pub: str, user_pub: str, name: str,
             permissions: dict[str, Any]) -> str:
    """A user of `account_pub`, issued by one of its signing keys (or the account key itself)."""
    nats: dict[str, Any] = {"pub": permissions.get("pub", {}), "sub": permissions.get("sub", {}),
                            "subs": UNLIMITED, "data": UNLIMITED, "payload": UNLIMITED,
                            "type": "user", "version": 2}
    if public_key(signing_seed) != account_pub:
        nats["issuer_account"] = account_pub
    return encode({"name": name, "sub": user_pub, "nats": nats}, signing_seed)


def creds(user_jwt_text: str, user_seed: str) -> str:
    """The .creds file nats clients read (nats-py: `user_credentials=path`)."""
    return ("-----BEGIN NATS USER JWT-----\n" + user_jwt_text + "\n------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n"
            "NKEYs are sensitive and should be treated as secrets.\n\n"
            "-----BEGIN USER NKEY SEED-----\n" + user_seed + "\n------END USER NKEY SEED------\n\n"
            "*************************************************************\n")


def creds_jwt(text: str) -> str:
    """The user JWT out of a .creds file's text."""
    lines = [ln.strip() for ln in text.splitlines()]
    return lines[lines.index("-----BEGIN NATS USER JWT-----") + 1]
