"""Events of a workspace's secrets: set (sealed) and deleted.

Subjects are `levers9.<workspace>.secret.<name>.<EventType>`.
"""

from __future__ import annotations

from .base import Event


class SecretSet(Event, frozen=True, kw_only=True):
    """The value is sealed (levers9.runtime.sealing, AES-256-GCM); plaintext never enters the log."""
    AGGREGATE = "secret"
    ID_FIELD = "name"
    name: str
    ciphertext: str


class SecretDeleted(Event, frozen=True, kw_only=True):
    AGGREGATE = "secret"
    ID_FIELD = "name"
    name: str
