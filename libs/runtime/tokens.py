"""Tokens: the one place that mints them and hashes them. Only the sha256 enters the log."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from levers9.contracts import events as E
from levers9.contracts import uuid7

TOKEN_PREFIX = "l9_"


@dataclass(frozen=True)
class Minted:
    token_id: str
    secret: str  # shown once, to whoever asked; never stored
    event: E.TokenCreated


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.strip().encode()).hexdigest()


def mint(name: str = "", scope: str = "workspace") -> Minted:
    """A new token and the TokenCreated event that makes it valid once appended."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = uuid7()
    return Minted(token_id, secret, E.TokenCreated(token_id=token_id, token_sha256=token_hash(secret), name=name,
                                                   scope=scope))
