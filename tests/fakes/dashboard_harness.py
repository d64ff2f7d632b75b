"""The dashboard served against the FAKE gateway (fake_gateway.py), on ledger ports, for its tests
and benchmarks: `async with dashboard(tmp_path) as h:` gives the fake, the app and both URLs, and
`await h.signed_in("tok-a")` a browser-like client that signed in through a one-time ticket.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

import httpx

from fakes.fake_gateway import FakeGateway, serving
from levers9.dashboard.app import Config, create, running


@dataclass
class Harness:
    gw: FakeGateway
    app: Any
    gateway_url: str
    url: str

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, trust_env=False, timeout=10, **kwargs)

    async def ticket(self, token: str) -> str:
        async with self.client() as c:
            r = await c.post("/api/session/tickets", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 201, r.text
            return r.json()["url"]

    async def signed_in(self, token: str) -> httpx.AsyncClient:
        """A client holding a session of `token`'s workspace, and sending its CSRF header (as the
        web app does) and its own Origin."""
        url = await self.ticket(token)
        c = self.client()
        r = await c.get(url)
        assert r.status_code == 303 and r.headers["location"] == "/", r.text
        c.headers["X-CSRF-Token"] = c.cookies["levers9_csrf"]
        c.headers["Origin"] = self.url
        return c


@contextlib.asynccontextmanager
async def dashboard(home: Path, gw: FakeGateway | None = None, web_out: Path | None = None,
                    **options: Any) -> AsyncIterator[Harness]:
    gw = gw or FakeGateway()
    async with serving(gw.app) as gateway_url:
        front, app = create(Config(gateway_url=gateway_url, home=home, web_out=web_out or home / "no-web-app",
                                   **options))
        async with running(app), serving(front) as url:
            yield Harness(gw, app, gateway_url, url)
