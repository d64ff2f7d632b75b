"""The gateway, as the dashboard reaches it: its REST API with the caller's own token on every call.

Nothing here holds a credential of its own: each method takes the token of the session or bearer
that asked. `whoami` answers are cached briefly by the token's hash, so a page's dozen calls cost the
gateway one check. A gateway that does not answer becomes GatewayDown (a 502 with its address).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, AsyncIterator, Callable

import httpx


class GatewayDown(Exception):
    """The gateway did not answer; the message names its address."""


WHOAMI_TTL_S = 15.0
IDEMPOTENT = frozenset({"GET", "HEAD"})
STALE_CONNECTION = (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)


class Upstream:
    def __init__(self, base_url: str, http: httpx.AsyncClient | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.base_url = base_url.rstrip("/")
        # idle connections are let go before the gateway's uvicorn closes them (5 s): one it closed
        # while we sent on it fails with ReadError (CI's browser run showed the page an error for it)
        self.http = http or httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0), trust_env=False,
                                              limits=httpx.Limits(keepalive_expiry=2.0))
        self.clock = clock
        self._whoami: dict[str, tuple[float, dict[str, Any] | None]] = {}

    async def close(self) -> None:
        await self.http.aclose()

    @staticmethod
    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    async def request(self, method: str, token: str, path: str, *, params: Any = None,
                      json: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
        tries = 2 if method in IDEMPOTENT else 1
        for attempt in range(tries):
            try:
                return await self.http.request(method, f"{self.base_url}{path}", params=params, json=json,
                                               headers={**self.auth(token), **(headers or {})})
            except httpx.HTTPError as exc:
                if isinstance(exc, STALE_CONNECTION) and attempt + 1 < tries:
                    continue  # a kept connection the gateway had just closed: once more, on a new one
                raise GatewayDown(f"the gateway at {self.base_url} does not answer: {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    async def get(self, token: str, path: str, params: Any = None) -> httpx.Response:
        return await self.request("GET", token, path, params=params)

    async def get_json(self, token: str, path: str, params: Any = None) -> tuple[int, Any, httpx.Headers]:
        r = await self.get(token, path, params)
        try:
            body = r.json()
        except ValueError:
            body = {"detail": r.text[:500]}
        return r.status_code, body, r.headers

    async def open_stream(self, method: str, token: str, path: str, *, params: Any = None,
                          headers: dict[str, str] | None = None, timeout: httpx.Timeout | None = None,
                          content: AsyncIterator[bytes] | None = None) -> httpx.Response:
        """A response whose body is read as it comes (the caller closes it); `content`, a body sent
        as it comes. `path` may carry its query (percent-encoding kept as written). A GET or HEAD
        without a body that meets a kept connection the gateway had just closed is sent once more, as
        `request` does (a notebook page's stylesheet failed to load for it: JupyterLab's error dialog)."""
        tries = 2 if method in IDEMPOTENT and content is None else 1
        for attempt in range(tries):
            req = self.http.build_request(method, f"{self.base_url}{path}", params=params, content=content,
                                          headers={**self.auth(token), **(headers or {})},
                                          timeout=timeout or httpx.Timeout(30.0, connect=5.0, read=None))
            try:
                return await self.http.send(req, stream=True)
            except httpx.HTTPError as exc:
                if isinstance(exc, STALE_CONNECTION) and attempt + 1 < tries:
                    continue
                raise GatewayDown(f"the gateway at {self.base_url} does not answer: {type(exc).__name__}: "
                                  f"{exc}") from exc
        raise AssertionError("unreachable")

    async def whoami(self, token: str) -> dict[str, Any] | None:
        """{"workspace", "token_id", "scope"} for a token the gateway accepts, None for one it refuses."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        cached = self._whoami.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        r = await self.get(token, "/api/v1/whoami")
        if r.status_code in (401, 403):
            who = None
        elif r.status_code == 200:
            who = r.json()
        else:
            raise GatewayDown(f"the gateway at {self.base_url} answered /api/v1/whoami with {r.status_code}")
        if len(self._whoami) > 10_000:  # bounded: tokens of every browser and agent that asked
            self._whoami.clear()
        self._whoami[key] = (now + WHOAMI_TTL_S, who)
        return who

    def forget(self, token: str) -> None:
        self._whoami.pop(hashlib.sha256(token.encode()).hexdigest(), None)


async def sse_messages(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, str, str]]:
    """(id, event, data) of each Server-Sent Events message in `lines`; comments are skipped."""
    msg_id, event = "", ""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield msg_id, event or "message", "\n".join(data)
            msg_id, event, data = "", "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "id":
            msg_id = value
        elif field == "event":
            event = value
        elif field == "data":
            data.append(value)
