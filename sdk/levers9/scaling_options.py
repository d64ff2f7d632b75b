"""The scaling options of `@app.endpoint`/`@app.asgi`/`@app.function`, checked where the user wrote
them: min/max/buffer containers, concurrency and the target the policy aims for, the scale-down
window (or its older name keep_warm_seconds), and a warm schedule of minimums in a time zone.

Standard library only, with one exception that is optional: cron expressions are checked with
cronsim when it is importable (on the machine that deploys, it is a dependency of levers9; inside a
container the SDK is mounted alone and the gateway has checked the spec already).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from .options import DEFAULT_MAX_CONTAINERS, DEFAULT_MIN_CONTAINERS, UNSET, ConfigError, given, section, whole

DEFAULT_CONCURRENCY = 1  # Scaling's default (levers9.contracts.spec)


def scaling(keep_warm_seconds: Any = UNSET, min_containers: Any = UNSET, max_containers: Any = UNSET,
            concurrency: Any = UNSET, buffer_containers: Any = UNSET, target_concurrency: Any = UNSET,
            scaledown_window: Any = UNSET, warm_schedule: Any = UNSET, warm_schedule_timezone: Any = UNSET,
            max_pending: Any = UNSET) -> Any:
    """The spec's scaling, as passed; the combinations are checked either way (min against max, the
    target against the hard cap, a buffer within max, one of the two names of the window)."""
    min_c = given(min_containers, lambda v: whole(v, "min_containers", 0, "min_containers=0"))
    max_c = given(max_containers, lambda v: whole(v, "max_containers", 1, "max_containers=1"))
    conc = given(concurrency, lambda v: whole(v, "concurrency", 1, "concurrency=4"))
    buffer = given(buffer_containers, lambda v: whole(v, "buffer_containers", 0, "buffer_containers=1"))
    target = given(target_concurrency, lambda v: whole(v, "target_concurrency", 1, "target_concurrency=2"))
    high = DEFAULT_MAX_CONTAINERS if max_c is UNSET else max_c
    _check_bounds(DEFAULT_MIN_CONTAINERS if min_c is UNSET else min_c, high,
                  DEFAULT_CONCURRENCY if conc is UNSET else conc, target, buffer)
    if keep_warm_seconds is not UNSET and scaledown_window is not UNSET and keep_warm_seconds != scaledown_window:
        raise ConfigError(f"scaledown_window={scaledown_window!r} and keep_warm_seconds={keep_warm_seconds!r}: they "
                          "are one setting (keep_warm_seconds is its older name): pass scaledown_window alone")
    window = given(scaledown_window, lambda v: whole(v, "scaledown_window", 0, "scaledown_window=60"))
    schedule = given(warm_schedule, lambda v: _schedule(v, high))
    zone = given(warm_schedule_timezone, _zone)
    return section({
        "keep_warm_seconds": given(keep_warm_seconds,
                                   lambda v: whole(v, "keep_warm_seconds", 0, "keep_warm_seconds=60")),
        "scaledown_window": window,
        "min_containers": min_c,
        "max_containers": max_c,
        "concurrency": conc,
        "buffer_containers": buffer,
        "target_concurrency": target,
        "warm_schedule": schedule,
        "warm_schedule_timezone": zone,
        "max_pending": given(max_pending, lambda v: whole(v, "max_pending", 0, "max_pending=100")),
    })


def _check_bounds(low: int, high: int, concurrency: int, target: Any, buffer: Any) -> None:
    if high < low:
        raise ConfigError(f"max_containers={high} is below min_containers={low}: raise max_containers "
                          f"to at least {low}")
    if target is not UNSET and target > concurrency:
        raise ConfigError(f"target_concurrency={target} is above concurrency={concurrency} (the most calls a "
                          f"container serves at once): lower target_concurrency or raise concurrency")
    if buffer is not UNSET and buffer > high:
        raise ConfigError(f"buffer_containers={buffer} is above max_containers={high}: raise max_containers")


def _schedule(value: Any, high: int) -> dict[str, int]:
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"warm_schedule {value!r} is not valid: use a dict of cron expression -> minimum "
                          "containers, e.g. warm_schedule={'0 8 * * 1-5': 2, '0 19 * * 1-5': 0}")
    out = {}
    for expr, minimum in value.items():
        if not isinstance(expr, str) or len(expr.split()) != 5:
            raise ConfigError(f"warm_schedule key {expr!r} is not a cron expression of five fields, "
                              "e.g. '0 8 * * 1-5'")
        _check_cron(expr)
        count = whole(minimum, f"warm_schedule[{expr!r}]", 0, "2")
        if count > high:
            raise ConfigError(f"warm_schedule[{expr!r}]={count} is above max_containers={high}: raise max_containers")
        out[expr] = count
    return out


def _check_cron(expr: str) -> None:
    try:  # imported here: inside a container the SDK is mounted alone (the gateway checked the spec)
        from cronsim import CronSim, CronSimError
    except ImportError:
        return
    try:
        CronSim(expr, _sample_time())
    except (CronSimError, ValueError) as exc:
        raise ConfigError(f"warm_schedule key {expr!r} is not a cron expression: {exc}") from None


def _zone(value: Any) -> str:
    # imported only when a time zone is given: zoneinfo reads sysconfig at import, which an app that
    # uses no schedule should not pay for (nor depend on) inside its container
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ConfigError(f"warm_schedule_timezone {value!r} is not a time zone: use a name of the tz database, "
                          "e.g. 'Europe/Berlin' or 'UTC'") from None
    return str(value)


def _sample_time() -> dt.datetime:
    return dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
