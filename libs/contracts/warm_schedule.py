"""Warm schedules: cron expressions in a time zone, each naming a minimum of containers from its tick on.

`warm_schedule={"0 8 * * 1-5": 2, "0 19 * * 1-5": 0}` with `warm_schedule_timezone="Europe/Berlin"`
keeps two containers warm from 08:00 on weekdays and none from 19:00. At any moment the entry whose
latest tick at or before now is the newest wins; before any entry has ticked (a schedule whose first
tick is still ahead and has none behind it within LOOKBACK) it says nothing.
Pure: the time is an argument. Cron is cronsim's (five fields, Debian cron's meaning of day-of-month
OR day-of-week); time zones are the system's tz database (zoneinfo).
"""

from __future__ import annotations

import datetime as dt
from typing import Mapping
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

LOOKBACK = dt.timedelta(days=400)  # a tick older than this never decides (a yearly cron still does)


class ScheduleError(ValueError):
    """A warm schedule that cannot be used: the message names the field and the entry."""


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleError(f"warm_schedule_timezone {name!r} is not a time zone (e.g. 'Europe/Berlin', 'UTC')") \
            from exc


def check(schedule: Mapping[str, int], timezone: str) -> None:
    """Refuse an expression cronsim cannot read or a time zone the system does not know."""
    tz = zone(timezone)
    start = dt.datetime(2026, 1, 1, tzinfo=tz)
    for expr in schedule:
        try:
            CronSim(expr, start)
        except (CronSimError, ValueError) as exc:
            raise ScheduleError(f"warm_schedule: {expr!r} is not a cron expression ({exc})") from None


def latest_tick(expr: str, now: dt.datetime) -> dt.datetime | None:
    """The entry's latest tick at or before `now` (aware), or None within LOOKBACK."""
    # cronsim's reverse iteration starts strictly before its start: a tick exactly at `now` counts
    it = CronSim(expr, now + dt.timedelta(seconds=1), reverse=True)
    tick = next(it, None)
    if tick is None or now - tick > LOOKBACK:
        return None
    return tick


def scheduled_minimum(schedule: Mapping[str, int], timezone: str, now: dt.datetime) -> tuple[int, str] | None:
    """The minimum the schedule asks for at `now` and the entry that set it, or None (no tick yet)."""
    if not schedule:
        return None
    local = now.astimezone(zone(timezone)).replace(microsecond=0)
    best: tuple[dt.datetime, str] | None = None
    for expr in sorted(schedule):  # sorted: two entries ticking at once decide the same way every time
        tick = latest_tick(expr, local)
        if tick is not None and (best is None or tick > best[0]):
            best = (tick, expr)
    if best is None:
        return None
    return schedule[best[1]], best[1]
