"""The Server-Timing header of a proxied call (pure): phases never negative, the start phases within
the call's own wait, a container ready before the call adds none, and the header's syntax."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from levers9.gateway.server_timing import header, phases

times = st.floats(min_value=0.0, max_value=1000.0, allow_nan=False)


@given(began=times, wait=times, answer=times, requested=times, scheduled=times, ready=times, restored=st.booleans())
def test_phases_are_never_negative_and_the_start_fits_in_the_wait(began, wait, answer, requested, scheduled, ready,
                                                                  restored):
    acquired, head = began + wait, began + wait + answer
    ready = min(ready, acquired)  # a call gets a slot only once its container is ready
    seen = {"requested": min(requested, scheduled, ready), "scheduled": min(scheduled, ready), "ready": ready}
    got = {name: ms for name, ms, _ in phases(began, acquired, head, seen, restored)}
    assert all(ms >= 0 for ms in got.values())
    assert got["queued"] == round(wait * 1000, 1) and got["first-byte"] == round(answer * 1000, 1)
    start = got.get("placed", 0) + got.get("restored", 0) + got.get("started", 0)
    assert start <= got["queued"] + 0.2  # rounding
    assert not ("restored" in got and "started" in got)
    if ready <= began:
        assert set(got) == {"queued", "first-byte"}  # the container was there already: no start seen


def test_a_cold_start_seen_by_the_call():
    seen = {"requested": 10.0, "scheduled": 10.25, "starting": 10.3, "ready": 11.5}
    got = phases(10.0, 11.5, 11.52, seen, restored=False)
    assert [(n, ms) for n, ms, _ in got] == [("queued", 1500.0), ("placed", 250.0), ("started", 1250.0),
                                             ("first-byte", 20.0)]
    value = header(got)
    assert re.fullmatch(r'([a-z-]+;dur=[0-9.]+;desc="[^"]*")(, [a-z-]+;dur=[0-9.]+;desc="[^"]*")*', value), value
    assert "restored" in header(phases(10.0, 11.5, 11.52, seen, restored=True))
