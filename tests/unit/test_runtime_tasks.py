"""`spawn`: a background task is referenced until it ends, and its failure is logged."""

from __future__ import annotations

import asyncio
import logging

import pytest

from levers9.runtime import tasks


async def test_a_failing_task_is_logged_with_its_name_and_exception(caplog):
    caplog.set_level(logging.ERROR, logger="levers9.tasks")

    async def boom() -> None:
        raise RuntimeError("the disk is full")

    task = tasks.spawn(boom(), name="dumper")  # its done-callbacks run before an awaiter resumes
    with pytest.raises(RuntimeError):
        await task
    [record] = [r for r in caplog.records if r.name == "levers9.tasks"]
    assert "dumper" in record.getMessage() and "the disk is full" in record.getMessage()
    assert record.exc_info is not None


async def test_a_task_is_referenced_until_it_ends_and_a_cancel_is_not_a_failure(caplog):
    caplog.set_level(logging.ERROR, logger="levers9.tasks")
    release = asyncio.Event()
    before = tasks.running()
    task = tasks.spawn(release.wait(), name="waiter")
    assert tasks.running() == before + 1
    release.set()
    assert await task is True
    assert tasks.running() == before
    stuck = tasks.spawn(asyncio.Event().wait(), name="stuck")
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    assert tasks.running() == before
    assert not [r for r in caplog.records if r.name == "levers9.tasks"]


async def test_any_awaitable_can_be_spawned_and_a_logger_chosen(caplog):
    caplog.set_level(logging.ERROR, logger="levers9.mine")
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = tasks.spawn(future, name="future", logger=logging.getLogger("levers9.mine"))
    future.set_result(7)
    assert await task == 7
    failing: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = tasks.spawn(failing, name="failing", logger=logging.getLogger("levers9.mine"))
    failing.set_exception(ValueError("nope"))
    with pytest.raises(ValueError):
        await task
    assert [r.getMessage() for r in caplog.records if r.name == "levers9.mine"] == [
        "task failing died: ValueError('nope')"]
