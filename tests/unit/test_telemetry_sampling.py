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
