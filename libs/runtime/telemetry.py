"""Structured logs that carry the correlation id, OpenTelemetry tracing through message headers,
and the Prometheus metrics every process exposes."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from fastapi.telemetry import TelemetryConfig
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler
from prometheus_client import Counter, Gauge, Histogram

correlation_id: contextvars.ContextVar[str] = contextvars.ContextVar("correlation_id", default="")

EVENTS_PUBLISHED = Counter("levers9_events_published_total", "Events appended to the log", ["type"])
EVENTS_CONSUMED = Counter("levers9_events_consumed_total", "Messages handled by a consumer",
                          ["consumer", "outcome"])
DEAD_LETTERS = Counter("levers9_dead_letters_total", "Messages sent to LEVERS9_DLQ", ["consumer"])
CONFLICTS = Counter("levers9_append_conflicts_total", "Optimistic-concurrency conflicts on append", ["type"])
PROJECTION_POSITION = Gauge("levers9_projection_position", "Last stream sequence applied", ["projection"])
BATCH_SECONDS = Histogram("levers9_consumer_batch_seconds", "Time to handle one fetched batch", ["consumer"])


_base_factory = logging.getLogRecordFactory()


def _record_with_correlation(*args, **kwargs) -> logging.LogRecord:
    """Stamp the correlation id on the record when it is created, inside the handling context, so
    handlers that format later (or elsewhere) still have it."""
    record = _base_factory(*args, **kwargs)
    if not hasattr(record, "correlation_id"):
        record.correlation_id = correlation_id.get()
    return record


logging.setLogRecordFactory(_record_with_correlation)


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        cid = getattr(record, "correlation_id", "")
        if cid:
            doc["correlation_id"] = cid
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            doc["trace_id"] = f"{span.trace_id:032x}"
        for key, value in getattr(record, "fields", {}).items():
            doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(service: str, level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("nats", "asyncio", "uvicorn.access", "botocore", "aiobotocore", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel("WARNING")


_configured = False
_ids = RandomIdGenerator()


def sampler_for(exporter: str) -> Sampler:
    """Spans are recorded only when something exports them. With none, each span is its context alone:
    its trace id still propagates gateway -> scheduler -> worker and into every log line, and the
    ASGI middleware skips collecting each request's attributes (recording spans that nobody read was
    7 % of the gateway's thread while tasks drained: py-spy, bench_tasks)."""
    return ALWAYS_OFF if str(exporter) == "none" else ALWAYS_ON


def setup_tracing(service: str, exporter: str = "none") -> None:
    """A real SDK tracer provider; spans are recorded and exported only when asked (console), but
    trace context always propagates so one trace spans gateway -> scheduler -> worker."""
    global _configured
    if _configured:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": f"levers9-{service}"}),
                              sampler=sampler_for(exporter))
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    trace.set_tracer_provider(provider)
    _configured = True


tracer = trace.get_tracer("levers9")


def web_telemetry(exporter: str) -> TelemetryConfig:
    """FastAPI's own telemetry (its `telemetry=` argument): a server span per request only when spans
    are exported. Without an exporter its span was never recorded, yet building it (headers parsed,
    attributes collected, context attached) was a fifth of the gateway's thread under warm calls
    (py-spy, bench_warm_calls); RequestTrace gives each request its trace context instead. Its
    metrics and logs stay off: the services' metrics are Prometheus's, their logs our own."""
    return {"tracing": str(exporter) != "none", "metrics": False, "logs": False}


class RequestTrace:
    """ASGI middleware, where FastAPI records no server span: each request runs in a trace context, the
    caller's when it sent a W3C `traceparent` (so a client's trace goes on into the events this request
    publishes), else a new one; the context alone, with no span recorded. Log lines carry its id."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"traceparent", b"tracestate")}
        ctx = propagate.extract(carrier) if carrier else None
        if ctx is None or not trace.get_current_span(ctx).get_span_context().is_valid:
            ctx = trace.set_span_in_context(trace.NonRecordingSpan(trace.SpanContext(
                trace_id=_ids.generate_trace_id(), span_id=_ids.generate_span_id(), is_remote=False)), ctx)
        token = otel_context.attach(ctx)
        try:
            await self.app(scope, receive, send)
        finally:
            otel_context.detach(token)


def inject(headers: dict[str, str]) -> dict[str, str]:
    propagate.inject(headers)
    return headers


@contextmanager
def consuming_span(name: str, headers: Mapping[str, str] | None, cid: str) -> Iterator[None]:
    """Continue the publisher's trace and bind the correlation id for logs while handling."""
    ctx = propagate.extract(dict(headers or {}))
    token = correlation_id.set(cid)
    try:
        with tracer.start_as_current_span(name, context=ctx, kind=trace.SpanKind.CONSUMER) as span:
            span.set_attribute("levers9.correlation_id", cid)
            yield
    finally:
        correlation_id.reset(token)


def log(logger: logging.Logger, level: int, msg: str, **fields: object) -> None:
    logger.log(level, msg, extra={"fields": fields})
