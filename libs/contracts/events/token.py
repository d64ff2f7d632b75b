"""Events of API tokens: created (only the secret's sha256) and revoked.

Subjects are `levers9.<workspace>.token.<token_id>.<EventType>`.
"""

from __future__ import annotations

from .base import Event


class TokenCreated(Event, frozen=True, kw_only=True):
    """Only the sha256 of the secret is ever in the log."""
    AGGREGATE = "token"
    ID_FIELD = "token_id"
    token_id: str
    token_sha256: str
    name: str = ""
    scope: str = "workspace"  # workspace | worker:<worker_id> (valid for that worker alone)


class TokenRevoked(Event, frozen=True, kw_only=True):
    AGGREGATE = "token"
    ID_FIELD = "token_id"
    token_id: str
