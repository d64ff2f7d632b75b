"""The SDK's task queues and schedules: the specs they emit (which the gateway decodes), the mistakes
they refuse naming the option, and what the decorated functions are."""

from __future__ import annotations

import json

import pytest

from levers9 import App, ConfigError, Scheduled, TaskHandle, TaskQueue
from levers9.contracts.spec import decode_spec


def test_a_task_queue_s_spec_carries_its_options_and_the_function_stays_callable():
    app = App("jobs")

    @app.task_queue(retries=3, retry_backoff=0.5, timeout=30, ttl=600, concurrency=4, max_containers=5,
                    tasks_per_container=10, callback_url="http://127.0.0.1:9/done", cpu=0.5)
    def resize(x):
        return x * 2

    [spec] = app.specs()
    assert isinstance(resize, TaskQueue) and resize(4) == 8 and resize.__wrapped__(1) == 2
    decoded = decode_spec(json.dumps(spec))
    assert decoded.code.kind == "function" and decoded.timeout_seconds == 30
    assert (decoded.scaling.concurrency, decoded.scaling.max_containers) == (4, 5)
    q = decoded.task_queue
    assert q is not None and (q.retries, q.retry_backoff, q.ttl, q.tasks_per_container, q.callback_url) == \
        (3, 0.5, 600, 10, "http://127.0.0.1:9/done")


def test_a_schedule_s_spec_names_its_cron_and_time_zone():
    app = App("jobs")

    @app.schedule("*/5 * * * *", timezone="Europe/Berlin", catch_up=False)
    def sweep():
        return "swept"

    @app.schedule(cron="0 3 * * *")
    def nightly():
        return "ok"

    specs = {s["name"]: decode_spec(json.dumps(s)) for s in app.specs()}
    assert isinstance(sweep, Scheduled) and sweep() == "swept"
    s = specs["sweep"].schedule
    assert s is not None and (s.cron, s.timezone, s.catch_up) == ("*/5 * * * *", "Europe/Berlin", False)
    assert specs["nightly"].schedule is not None and specs["nightly"].schedule.timezone == "UTC"


@pytest.mark.parametrize(("make", "option"), [
    (lambda app: app.task_queue(retries=11), "retries"),
    (lambda app: app.task_queue(ttl=0), "ttl"),
    (lambda app: app.task_queue(tasks_per_container=0), "tasks_per_container"),
    (lambda app: app.task_queue(callback_url="ftp://x"), "callback_url"),
    (lambda app: app.schedule("* * *"), "cron"),
    (lambda app: app.schedule("61 * * * *"), "cron"),
    (lambda app: app.schedule("* * * * *", timezone="Mars/Olympus"), "timezone"),
    (lambda app: app.schedule("* * * * *", catch_up="yes"), "catch_up"),
])
def test_mistakes_are_refused_naming_the_option(make, option):
    with pytest.raises(ConfigError, match=option):
        make(App("jobs"))


def test_a_task_handle_is_its_task_id():
    h = TaskHandle("01a24a1d-c3d3-7030-b084-0f384bd1141f")
    assert h == "01a24a1d-c3d3-7030-b084-0f384bd1141f" and h.task_id == str(h)
