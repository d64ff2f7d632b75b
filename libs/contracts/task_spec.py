"""What a task queue or a schedule adds to a deployed function's spec, checked at deploy.

`@app.task_queue(...)` and `@app.schedule(...)` (SDK) emit these as DeploymentSpec.task_queue and
DeploymentSpec.schedule. Validation lives here so a bad cron expression, time zone or callback URL is
refused when the spec is decoded (the gateway's deploy answers 422 naming the field), never when the
first tick or task comes.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
from cronsim import CronSim, CronSimError
from msgspec import Meta


class TaskQueueOptions(msgspec.Struct, frozen=True, kw_only=True):
    """A deployed function whose calls are tasks: put on its queue, run at least once, recorded once.
    The per-attempt timeout is the spec's timeout_seconds; concurrency and max_containers its scaling."""
    retries: Annotated[int, Meta(ge=0, le=10)] = 0
    retry_backoff: Annotated[float, Meta(ge=0, le=3600)] = 1.0  # seconds before the first retry, doubled after
    ttl: Annotated[float, Meta(gt=0, le=7 * 86_400)] = 3600.0  # seconds a task may wait before it starts
    tasks_per_container: Annotated[int, Meta(ge=1, le=10_000)] = 1  # the autoscaler's target of waiting tasks
    callback_url: Annotated[str, Meta(max_length=2000)] = ""

    def __post_init__(self) -> None:
        if self.callback_url:
            url = urlsplit(self.callback_url)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(f"callback_url {self.callback_url!r} is not an http(s) URL")


class ScheduleOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Run the function on a cron in a time zone; a tick missed while the platform was down runs once
    when it is back, unless catch_up is False (then it is skipped)."""
    cron: Annotated[str, Meta(max_length=200)]
    timezone: Annotated[str, Meta(max_length=64)] = "UTC"
    catch_up: bool = True

    def __post_init__(self) -> None:
        try:
            tz = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone {self.timezone!r} is not a time zone (e.g. 'Europe/Berlin', 'UTC')") from None
        try:
            CronSim(self.cron, dt.datetime(2026, 1, 1, tzinfo=tz))
        except (CronSimError, ValueError) as exc:
            raise ValueError(f"cron {self.cron!r} is not a cron expression of five fields ({exc})") from None
