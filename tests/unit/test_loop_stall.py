"""The event loop's stall watch: lateness and the once-per-stall decision (properties), and a real
blocking call on a real loop, named by the watchdog's log with the blocking function in the stack."""

import asyncio
import logging
import time

from hypothesis import given
from hypothesis import strategies as st

from levers9.runtime.loop_stall import LOOP_LAG, StallWatch, lateness, stalled

times = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(times, times)
def test_lateness_is_never_negative_and_is_the_delay_when_late(due, now):
    late = lateness(due, now)
    assert late >= 0
    assert late == (now - due if now > due else 0.0)


@given(times, st.floats(min_value=0, max_value=100), st.floats(min_value=0.1, max_value=10))
def test_a_stall_is_reported_once_and_only_past_its_threshold(last_tick, gap, stall_s):
    now = last_tick + gap
    first = stalled(last_tick, now, None, stall_s)
    assert first == (now - last_tick >= stall_s)
    assert not stalled(last_tick, now + 100, last_tick, stall_s)  # this stall was reported already
    # a later stall (the loop ticked since) is a new one
    assert stalled(last_tick + 1, last_tick + 1 + 2 * stall_s, last_tick, stall_s)


def _block_the_loop_for(seconds: float) -> None:
    time.sleep(seconds)  # a blocking call, as a bug would make on the loop


def test_a_blocking_call_on_the_loop_is_logged_once_with_its_stack(caplog):
    watch = StallWatch(stall_s=0.5)
    before = LOOP_LAG._sum.get()

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.ensure_future(watch.run(stop))
        await asyncio.sleep(0.3)
        _block_the_loop_for(1.5)
        await asyncio.sleep(0.6)  # ticks again: the stall is over
        stop.set()
        await task

    with caplog.at_level(logging.WARNING, logger="levers9.runtime.loop_stall"):
        asyncio.run(main())
    stalls = [r.getMessage() for r in caplog.records if "event loop stalled" in r.getMessage()]
    # one stall, named; a loaded machine may add a stall of its own, never one for the same block twice
    assert [m for m in stalls if "_block_the_loop_for" in m] and watch.stalls == len(stalls)
    assert LOOP_LAG._sum.get() - before >= 1.0  # the late tick was measured too
    watch.watchdog.join(5)
    assert not watch.watchdog.is_alive()  # the watchdog ends with the watch


def test_a_loop_that_keeps_ticking_reports_no_stall(caplog):
    watch = StallWatch(stall_s=3.0)  # well above what a loaded machine's scheduling adds

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.ensure_future(watch.run(stop))
        for _ in range(10):
            await asyncio.sleep(0.1)
        stop.set()
        await task

    with caplog.at_level(logging.WARNING, logger="levers9.runtime.loop_stall"):
        asyncio.run(main())
    assert watch.stalls == 0
    assert not [r for r in caplog.records if "event loop stalled" in r.getMessage()]
