"""Tracing without an exporter records nothing, yet one trace still spans the services: a span is its
context alone (a valid trace id, continued from the caller's traceparent and passed on), so the
logs' trace_id ties a call's lines together across processes. With an exporter, spans are recorded."""

from __future__ import annotations

import pytest
from opentelemetry import propagate
from opentelemetry.sdk.trace import TracerProvider

from levers9.runtime.config import OtelExporter
from levers9.runtime.telemetry import sampler_for

CALLER = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


@pytest.mark.parametrize("exporter, recording", [(OtelExporter.NONE, False), ("none", False),
                                                 (OtelExporter.CONSOLE, True)])
def test_spans_are_recorded_only_when_exported_and_their_trace_always_goes_on(exporter, recording):
    tracer = TracerProvider(sampler=sampler_for(exporter)).get_tracer("test")
    with tracer.start_as_current_span("handle", context=propagate.extract(CALLER)) as span:
        ctx, recorded = span.get_span_context(), span.is_recording()
        passed_on: dict[str, str] = {}
        propagate.inject(passed_on)
        with tracer.start_as_current_span("publish") as child:
            assert child.get_span_context().trace_id == ctx.trace_id
    assert ctx.is_valid and f"{ctx.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert passed_on["traceparent"].split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    assert recorded is recording


def web_app(exporter: str):
    """A FastAPI app as a service builds it (libs/runtime/service.py), answering the trace id it ran in."""
    from fastapi import FastAPI
    from opentelemetry import trace

    from levers9.runtime.telemetry import RequestTrace, web_telemetry

    config = web_telemetry(exporter)
    app = FastAPI(telemetry=config)
    if not config["tracing"]:
        app.add_middleware(RequestTrace)

    @app.get("/t")
    async def traced() -> dict[str, str]:
        ctx = trace.get_current_span().get_span_context()
        return {"trace_id": f"{ctx.trace_id:032x}" if ctx.is_valid else ""}
    return app


def test_without_an_exporter_a_request_still_runs_in_its_callers_trace_or_a_new_one():
    from fastapi.testclient import TestClient

    with TestClient(web_app("none")) as client:
        assert client.get("/t", headers=CALLER).json()["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
        first, second = (client.get("/t").json()["trace_id"] for _ in range(2))
        assert first and second and first != second  # a new trace each, not none and not a shared one
        broken = client.get("/t", headers={"traceparent": "00-zz-yy-01"}).json()["trace_id"]
        assert broken and broken != first


def test_with_an_exporter_fastapi_records_the_server_span_itself():
    from levers9.runtime.telemetry import web_telemetry

    assert web_telemetry("console")["tracing"] is True
    assert web_telemetry("none")["tracing"] is False
