"""The dashboard process (`levers9 service dashboard`, started by `levers9 up` beside the six
services): the app of app.py on LEVERS9_HTTP_HOST:LEVERS9_HTTP_PORT, talking to the gateway at
LEVERS9_GATEWAY_URL, its session key under LEVERS9_HOME. Unlike the six it connects to no NATS and
no database (it is a client of the gateway), so it has its own small shell instead of
levers9.runtime.service.Service: the same logs, /healthz, /metrics and graceful SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import uvicorn

from levers9.runtime.config import Settings, unknown_warning
from levers9.runtime.service import _Server
from levers9.runtime.tasks import spawn
from levers9.runtime.telemetry import setup_logging

from .app import Config, create, running

log = logging.getLogger("levers9.dashboard")


class DashboardService:
    name = "dashboard"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stop = asyncio.Event()

    def config(self) -> Config:
        s = self.settings
        if not s.client.gateway_url:
            raise SystemExit("levers9 dashboard: LEVERS9_GATEWAY_URL must be set (or run `levers9 up`, which sets it)")
        return Config(gateway_url=s.client.gateway_url, home=s.home_path)

    async def run(self) -> None:
        s = self.settings
        setup_logging(self.name, s.telemetry.log_level, s.telemetry.log_format)
        if s.unknown_env:
            log.warning("%s", unknown_warning(s))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        front, app = create(self.config())
        server = _Server(uvicorn.Config(front, host=s.process.http_host, port=s.process.http_port, log_config=None,
                                        access_log=False, lifespan="off", proxy_headers=True, timeout_graceful_shutdown=3))
        async with running(app):
            task = spawn(server.serve(), name="dashboard http", logger=log)
            log.info("dashboard started on %s:%s, gateway %s", s.process.http_host, s.process.http_port,
                     s.client.gateway_url)
            stop = spawn(self.stop.wait(), name="dashboard stop")
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            server.should_exit = True
            await app.state.hubs.close()  # open /events streams end now, so the server stops at once
            done, _ = await asyncio.wait({task}, timeout=5)
            if not done:
                task.cancel()
            stop.cancel()
        log.info("dashboard stopped")
