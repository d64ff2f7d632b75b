"""Identifiers: time-ordered UUIDv7 ids, and the validation that keeps subjects unforgeable.

A workspace name or an aggregate id becomes a token of a NATS subject, so neither may contain a dot,
a wildcard (`*`, `>`) or whitespace; otherwise `levers9.acme.container.x.>` could be smuggled in.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid

SYSTEM_WORKSPACE = "_sys"

WORKSPACE_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class InvalidName(ValueError):
    """A workspace or id that cannot be a subject token."""


_lock = threading.Lock()
_last = (0, 0)  # (unix_ms, 12-bit counter) of the previous id, to stay monotonic within a millisecond


def uuid7() -> str:
    """A UUIDv7 string (RFC 9562): 48-bit unix ms, then a counter and random bits; sorts by time."""
    global _last
    with _lock:
        ms = time.time_ns() // 1_000_000
        last_ms, counter = _last
        if ms <= last_ms:
            ms, counter = last_ms, counter + 1
            if counter > 0xFFF:  # counter overflow: borrow the next millisecond
                ms, counter = ms + 1, 0
        else:
            counter = int.from_bytes(os.urandom(2), "big") & 0x3FF
        _last = (ms, counter)
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand
    return str(uuid.UUID(int=value))


def uuid7_time_ms(value: str) -> int:
    return uuid.UUID(value).int >> 80


def is_workspace(name: str, allow_system: bool = True) -> bool:
    return bool(WORKSPACE_RE.fullmatch(name)) or (allow_system and name == SYSTEM_WORKSPACE)


def check_workspace(name: str, allow_system: bool = True) -> str:
    if not isinstance(name, str) or not is_workspace(name, allow_system):
        raise InvalidName(
            f"workspace {name!r} is not valid: use 1-63 lowercase letters, digits or '-', "
            "starting with a letter or digit")
    return name


def check_id(value: str, what: str = "id") -> str:
    if not isinstance(value, str) or not ID_RE.fullmatch(value):
        raise InvalidName(
            f"{what} {value!r} is not valid: use 1-128 letters, digits, '_' or '-', "
            "starting with a letter or digit (no dots, wildcards or spaces)")
    return value
