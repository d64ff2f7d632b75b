"""The shell every service process shares: connect, set up its schema, run its consumers and its
HTTP endpoints (/healthz, /metrics), and stop gracefully on SIGTERM.

A service subclasses `Service`, lists its projections and reactions, and adds routes if it has any.
Graceful stop: the consumers finish the batch or message in hand, the HTTP server stops, NATS is
drained, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from typing import Any, Awaitable, Callable, Sequence

import asyncpg
import uvicorn
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tenacity import AsyncRetrying, stop_after_delay, wait_exponential

from . import telemetry
from .bus import Bus
from .bus_auth import BusAuth
from .config import Settings, unknown_warning
from .consumer import Delivery, OrderedConsumer, WorkConsumer
from .loop_stall import StallWatch
from .projection import Projection, ProjectionStore, schema_for
from .tasks import spawn
from .telemetry import consuming_span, setup_logging, setup_tracing

log = logging.getLogger("levers9.service")


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # the service owns SIGTERM; uvicorn must not swallow it
        yield


class Service:
    name: str = ""
    projections: Sequence[Projection] = ()
    # set by connect(), before on_start(): everything after it may use them as they are
    bus: Bus
    pool: asyncpg.Pool
    store: ProjectionStore

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stop = asyncio.Event()
        self.started_at = time.time()
        self.schema = schema_for(self.name)
        self.projected: dict[str, int] = {}  # projection name -> last stream sequence applied
        self._advanced = asyncio.Condition()

    # ---- hooks for subclasses ------------------------------------------------------------------

    def reactions(self) -> list[WorkConsumer]:
        """Durable consumers with side effects; none by default."""
        return []

    def background(self) -> list[Callable[[asyncio.Event], Awaitable[None]]]:
        """Loops that run beside the consumers (heartbeats, timers); each gets the stop event."""
        return []

    def routes(self, app: FastAPI) -> None:
        """Extra HTTP routes."""

    async def on_start(self) -> None:
        """After connecting and setting up the schema, before consuming."""

    async def on_stop(self) -> None:
        """After the consumers stopped, before disconnecting."""

    async def health_detail(self) -> dict[str, Any]:
        return {}

    # ---- wiring --------------------------------------------------------------------------------

    async def connect(self) -> None:
        s = self.settings
        if not s.bus.nats_url or not s.database.url:
            raise SystemExit(f"levers9 {self.name}: LEVERS9_NATS_URL and LEVERS9_DATABASE_URL must be set "
                             "(or run `levers9 up`, which sets them)")
        async for attempt in AsyncRetrying(stop=stop_after_delay(30), wait=wait_exponential(0.2, max=3),
                                           reraise=True):
            with attempt:
                self.bus = await Bus.connect(s.bus.nats_url, name=f"levers9-{self.name}",
                                             auth=BusAuth.from_settings(s))
        await self.bus.ensure_topology()
        async for attempt in AsyncRetrying(stop=stop_after_delay(30), wait=wait_exponential(0.2, max=3),
                                           reraise=True):
            with attempt:
                self.pool = await asyncpg.create_pool(s.database.url, min_size=1, max_size=8)
        self.store = ProjectionStore(self.pool, self.schema, self.projections)
        await self.store.setup()
        for p in self.projections:
            self.projected[p.name] = await self.store.position(p)

    def ordered_consumers(self) -> list[OrderedConsumer]:
        out: list[OrderedConsumer] = []
        for p in self.projections:
            async def position(p: Projection = p) -> int:
                return await self.store.position(p)

            async def handle(batch: list[Delivery], p: Projection = p) -> None:
                await self.apply(p, batch)

            out.append(OrderedConsumer(self.bus, f"{self.schema}-{p.name}", p.filter_subjects, position=position,
                                       handle=handle, batch=self.settings.consumers.fetch_batch,
                                       max_deliver=self.settings.consumers.max_deliver))
        return out

    async def apply(self, p: Projection, batch: list[Delivery]) -> None:
        """Apply a batch to a projection inside a span that continues the publisher's trace."""
        last = batch[-1]
        cid = last.message.envelope.correlation_id if last.message else ""
        with consuming_span(f"project {p.name}", last.headers, cid):
            await self.store.apply_batch(p, batch)
        await self.advanced(p.name, last.seq)

    async def advanced(self, projection: str, seq: int) -> None:
        async with self._advanced:
            self.projected[projection] = max(seq, self.projected.get(projection, 0))
            self._advanced.notify_all()

    async def wait_projected(self, seq: int, projection: str | None = None, timeout: float = 5.0) -> bool:
        """Wait until `projection` (every projection when None) has applied stream sequence `seq`.

        `seq` must be the sequence of an event the projection consumes (or an earlier one): a
        projection's position moves only with the events of its own subjects. False on timeout.
        """
        names = [projection] if projection else [p.name for p in self.projections]

        def caught_up() -> bool:
            return all(self.projected.get(n, 0) >= seq for n in names)

        if caught_up():  # also with timeout=0, where wait_for would time out before looking
            return True
        async with self._advanced:
            try:  # in this task (not wait_for's): see levers9.gateway.router, acquire
                async with asyncio.timeout(timeout):
                    await self._advanced.wait_for(caught_up)
            except TimeoutError:
                return False
        return True

    def app(self) -> FastAPI:
        web = telemetry.web_telemetry(self.settings.telemetry.otel_exporter)
        app = FastAPI(title=f"levers9 {self.name}", version="0.1.0", telemetry=web)
        if not web["tracing"]:
            app.add_middleware(telemetry.RequestTrace)

        @app.get("/healthz")
        async def healthz(response: Response) -> dict[str, Any]:
            checks = await self.checks()
            ok = all(v == "ok" for v in checks.values())
            response.status_code = 200 if ok else 503
            return {"service": self.name, "healthy": ok, "checks": checks,
                    "uptime_s": round(time.time() - self.started_at, 1), **(await self.health_detail())}

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

        self.routes(app)
        return app

    async def checks(self) -> dict[str, str]:
        bus: Bus | None = getattr(self, "bus", None)  # None until connect()
        out = {"nats": "ok" if bus and bus.nc.is_connected else "disconnected"}
        try:
            await asyncio.wait_for(self.pool.fetchval("SELECT 1"), timeout=2)
            out["postgres"] = "ok"
        except Exception as exc:  # noqa: BLE001 - health reports, never raises
            out["postgres"] = f"error: {exc}"
        if self.stop.is_set():
            out["lifecycle"] = "stopping"
        return out

    async def run(self) -> None:
        s = self.settings
        setup_logging(self.name, s.telemetry.log_level, s.telemetry.log_format)
        setup_tracing(self.name, s.telemetry.otel_exporter)
        if s.unknown_env:  # most likely a misspelt setting: say so rather than ignore it silently
            log.warning("%s", unknown_warning(s))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        await self.connect()
        await self.on_start()
        server = _Server(uvicorn.Config(self.app(), host=s.process.http_host, port=s.process.http_port, log_config=None,
                                        access_log=False, lifespan="off"))
        server_task = spawn(server.serve(), name=f"{self.name} http", logger=log)
        failed = await self._run_loops(server_task)
        server.should_exit = True
        done, _ = await asyncio.wait({server_task}, timeout=5)  # its failure is logged by spawn
        if not done:
            server_task.cancel()
        await self.on_stop()
        await self.bus.close()
        await self.pool.close()
        log.info("%s stopped", self.name)
        if failed:
            raise SystemExit(1)

    async def _run_loops(self, server_task: asyncio.Task[None]) -> bool:
        """Run the consumers and background loops until asked to stop, the HTTP server ends, or a
        loop dies (its exception is logged by spawn); True when one died. On return every loop has
        finished the work in hand (or 20 s passed)."""
        s = self.settings
        loops = [c.run for c in self.ordered_consumers()] + [c.run for c in self.reactions()] + self.background()
        loops.append(StallWatch().run)  # a blocking call on the loop, measured and named (loop_stall)
        tasks = [spawn(fn(self.stop), name=f"{self.name} {getattr(fn, '__qualname__', fn)}", logger=log)
                 for fn in loops]
        log.info("%s started on %s:%s", self.name, s.process.http_host, s.process.http_port)
        stop_wait = spawn(self.stop.wait(), name=f"{self.name} stop")
        failed = False
        pending: set[asyncio.Task[Any]] = {stop_wait, server_task, *tasks}
        while not self.stop.is_set() and not server_task.done():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            # a loop that finished its job (e.g. registering) is fine; one that died stops the process
            if any(t is not stop_wait and not t.cancelled() and t.exception() for t in done):
                failed = True
                break
        self.stop.set()
        log.info("%s stopping: finishing the work in hand", self.name)
        if tasks:
            await asyncio.wait(tasks, timeout=20)
        return failed
