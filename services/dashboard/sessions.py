"""Browser sessions and one-time sign-in tickets.

A session is the user's own gateway token, sealed (Fernet: AES-128-CBC + HMAC-SHA256) into the
HttpOnly cookie `levers9_session` together with its workspace, its CSRF token and when it was
issued. The key lives in a file under the levers9 home (mode 0600), so a restarted dashboard opens
the cookies it sealed before; nothing of a session is kept server-side.

A ticket (`levers9 dashboard`) is a random string whose sha256 maps, in memory, to the token it
signs in; it is valid for TICKET_TTL_S and redeemed once. A restart forgets outstanding tickets:
the CLI makes a new one in a second. The clock is injectable for the tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cryptography.fernet import Fernet, InvalidToken

TICKET_TTL_S = 120.0
SESSION_TTL_S = 12 * 3600  # a browser signs in again after this long
SESSION_COOKIE = "levers9_session"
CSRF_COOKIE = "levers9_csrf"
KEY_FILE = "dashboard/session.key"


@dataclass(frozen=True)
class Session:
    token: str
    workspace: str
    csrf: str
    issued_at: float


def load_key(home: Path) -> bytes:
    """The sealing key under `home`, made (0600) on first use; a key file others may read is
    tightened, since whoever reads it can open every session."""
    path = home / KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            os.chmod(path, 0o600)
        key = path.read_bytes().strip()
        Fernet(key)  # a damaged key file says so here, not at the first sign-in
        return key
    key = Fernet.generate_key()
    with os.fdopen(fd, "wb") as f:
        f.write(key + b"\n")
    return key


class Sealer:
    def __init__(self, key: bytes, clock: Callable[[], float] = time.time) -> None:
        self.fernet = Fernet(key)
        self.clock = clock

    def seal(self, token: str, workspace: str) -> tuple[str, Session]:
        session = Session(token=token, workspace=workspace, csrf=secrets.token_urlsafe(24), issued_at=self.clock())
        body = json.dumps({"t": token, "w": workspace, "c": session.csrf}).encode()
        return self.fernet.encrypt_at_time(body, int(session.issued_at)).decode(), session

    def open(self, cookie: str | None) -> Session | None:
        """The session in `cookie`, or None when it is absent, forged, damaged or too old."""
        if not cookie:
            return None
        try:
            body = self.fernet.decrypt_at_time(cookie.encode(), SESSION_TTL_S, int(self.clock()))
            issued = self.fernet.extract_timestamp(cookie.encode())
            doc = json.loads(body)
            return Session(token=str(doc["t"]), workspace=str(doc["w"]), csrf=str(doc["c"]), issued_at=float(issued))
        except (InvalidToken, ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class Ticket:
    token: str
    workspace: str
    expires_at: float


class Tickets:
    """One-time sign-in tickets, held by their sha256 (a memory dump shows no usable ticket)."""

    def __init__(self, ttl_s: float = TICKET_TTL_S, clock: Callable[[], float] = time.time) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._by_hash: dict[str, Ticket] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _hash(ticket: str) -> str:
        return hashlib.sha256(ticket.encode()).hexdigest()

    def issue(self, token: str, workspace: str) -> tuple[str, float]:
        ticket = secrets.token_urlsafe(32)
        expires = self.clock() + self.ttl_s
        with self._lock:
            self._purge()
            self._by_hash[self._hash(ticket)] = Ticket(token, workspace, expires)
        return ticket, expires

    def redeem(self, ticket: str) -> Ticket | None:
        """The ticket's token, once: None when unknown, already used or expired."""
        with self._lock:
            self._purge()
            return self._by_hash.pop(self._hash(ticket or ""), None)

    def _purge(self) -> None:
        now = self.clock()
        for h in [h for h, t in self._by_hash.items() if t.expires_at <= now]:
            del self._by_hash[h]

    def __len__(self) -> int:
        return len(self._by_hash)
