"""When a schedule fires: its ticks between the last one fired and now, pure (the time is an argument).

A tick missed while the platform was down runs once when it is back (catch_up, the default): the
missed ticks fold into one run, at the latest of them. With catch_up off, a tick found later than
GRACE after its time is skipped, and the schedule waits for its next one. Cron is cronsim's (five
fields), in the schedule's time zone (zoneinfo), so a daylight-saving change moves the ticks with
the wall clock as cron users expect.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from cronsim import CronSim

GRACE = dt.timedelta(seconds=60)  # a tick this late is still on time (catch_up off)
MAX_SCAN = 100_000  # ticks walked at most to find the latest due one (every minute for ~70 days)


@dataclass(frozen=True)
class Due:
    tick: dt.datetime | None  # the tick to fire now (aware, UTC); None: nothing to fire
    skipped: int  # ticks passed over (missed and not run)
    passed: dt.datetime | None  # the latest tick at or before now, fired or skipped: the next "after"


def next_ticks(cron: str, timezone: str, after: dt.datetime, count: int = 1) -> list[dt.datetime]:
    """The next `count` ticks strictly after `after`, in UTC."""
    it = CronSim(cron, after.astimezone(ZoneInfo(timezone)))
    out: list[dt.datetime] = []
    for tick in it:
        out.append(tick.astimezone(dt.timezone.utc))
        if len(out) >= count:
            break
    return out


def due(cron: str, timezone: str, after: dt.datetime, now: dt.datetime, catch_up: bool = True) -> Due:
    """What to fire at `now`, given the last tick handled was `after` (or the schedule's creation)."""
    latest: dt.datetime | None = None
    count = 0
    for tick in CronSim(cron, after.astimezone(ZoneInfo(timezone)).replace(microsecond=0)):
        if tick > now or count >= MAX_SCAN:
            break
        latest, count = tick, count + 1
    if latest is None:
        return Due(None, 0, None)
    latest = latest.astimezone(dt.timezone.utc)
    if catch_up or now - latest <= GRACE:
        return Due(latest, count - 1, latest)
    return Due(None, count, latest)
