"""The autoscaling policy: how many containers a deployment should have, which to start, which to stop.

One pure function, `decide`, used where scaling is applied (the scheduler's autoscaler) and by
anyone who shows the desired count (`levers9 deployments list`). No I/O: the clock is an argument.
The rules, in this order:
1. the floor is `min_containers`, raised by the warm schedule's current minimum (the entry whose
   latest tick at or before now is the newest);
2. the load needs ceil(calls / target_concurrency) containers for its calls (waiting and in flight;
   `concurrency` stays the hard cap the gateway enforces per container), or for a task queue
   ceil(tasks not started / tasks_per_container) when that is more (the larger, not the sum: a task
   a runner took waits for its sandbox as a call, and is not started until it has one);
3. desired = max(floor, need), plus `buffer_containers` idle ones while there is any load or
   floor (a deployment with neither scales to zero), never above `max_containers`;
4. fewer live containers than desired: start the difference (live counts those still starting, so
   a start in flight is never asked for twice);
5. more than desired: stop idle ready ones (nothing in flight) that have been idle for
   `scaledown_window`, the longest idle first, down to desired; above `max_containers` (the user
   lowered it) idle ones stop at once. A busy or starting container is never stopped, and nothing is
   stopped while the load is not known (no gateway reported): a call might be in flight;
6. after containers failed before they were ready, starts wait out a back-off (`crash_backoff_s`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Sequence

import msgspec

from .spec import DeploymentSpec, Scaling
from .task_spec import TaskQueueOptions
from .warm_schedule import scheduled_minimum

LIVE = frozenset({"requested", "pending", "scheduled", "starting", "ready"})
SCALED_KINDS = frozenset({"endpoint", "asgi", "realtime", "box"})


def governed(spec: DeploymentSpec | None) -> bool:
    """Whether the autoscaler scales this deployment's containers (and the worker's idle rule leaves
    them alone): endpoints, ASGI apps, realtime handlers, task queues, scheduled functions and deployed functions
    (`levers9 deploy`: kind "function" naming its module and handler). An ad-hoc function's sandboxes
    (kind "function" with no module: each call brings its function pickled) keep the worker's
    keep-warm rule. So does a session's sandbox of a deployed function (ContainerRequested.session_id):
    it carries its deployment's id but is one caller's own, so the autoscaler skips it and the worker
    keeps its keep-warm for it (levers9.scheduler.autoscaler, levers9.worker.lifecycle.containers)."""
    if spec is None:
        return False
    if spec.code.kind == "function" and spec.code.module and spec.code.handler:
        return True
    return spec.code.kind in SCALED_KINDS or spec.task_queue is not None or spec.schedule is not None


def tasks_per_container(spec: DeploymentSpec) -> int:
    """The queue's target of waiting tasks per container; 0 for a deployment that takes no tasks."""
    if spec.task_queue is None and spec.schedule is None:
        return 0
    return (spec.task_queue or TaskQueueOptions()).tasks_per_container


@dataclass(frozen=True)
class Box:
    """One container of the deployment, as the policy sees it."""
    container_id: str
    status: str  # a container status (views.CONTAINER_STATUS); only LIVE ones count
    inflight: int = 0  # calls or tasks it serves now
    idle_since: float | None = None  # unix seconds since when it served nothing; None: not ready yet
    stopping: bool = False  # its stop was requested already: it no longer counts


@dataclass(frozen=True)
class Load:
    """What the deployment is asked to do now (summed over the gateways that report it)."""
    waiting: int = 0  # calls waiting for a container
    inflight: int = 0  # calls being served
    queued_tasks: int = 0
    tasks_per_container: int = 0  # 0: this deployment takes no tasks
    known: bool = True  # False: no gateway reported lately, so nothing may be stopped


@dataclass(frozen=True)
class Stop:
    container_id: str
    reason: str


@dataclass(frozen=True)
class Decision:
    desired: int
    live: int
    start: int  # containers to start now
    start_reason: str  # "" when none
    stop: tuple[Stop, ...] = ()
    held_s: float = 0.0  # > 0: starts were due but wait this long yet for the crash back-off (rule 6)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b) if a > 0 else 0


def floor_of(scaling: Scaling, now: dt.datetime) -> tuple[int, str]:
    """Rule 1: the containers kept warm whatever the load, and why."""
    scheduled = scheduled_minimum(scaling.warm_schedule, scaling.warm_schedule_timezone, now)
    if scheduled is not None and scheduled[0] > scaling.min_containers:
        return scheduled[0], f"warm schedule {scheduled[1]!r} keeps {scheduled[0]} warm"
    return scaling.min_containers, f"min_containers={scaling.min_containers}"


def needed(scaling: Scaling, load: Load) -> tuple[int, str]:
    """Rule 2: the containers the load needs, and why."""
    calls = load.waiting + load.inflight
    for_calls = ceil_div(calls, scaling.target)
    for_tasks = ceil_div(load.queued_tasks, load.tasks_per_container) if load.tasks_per_container else 0
    parts = []
    if for_calls:
        parts.append(f"{calls} calls ({load.waiting} waiting) at target_concurrency={scaling.target}")
    if for_tasks:
        parts.append(f"{load.queued_tasks} queued tasks at tasks_per_container={load.tasks_per_container}")
    return max(for_calls, for_tasks), " and ".join(parts)


def desired_of(scaling: Scaling, load: Load, now: dt.datetime) -> tuple[int, str]:
    """Rule 3: how many containers the deployment should have, and the term that set it."""
    floor, floor_why = floor_of(scaling, now)
    need, need_why = needed(scaling, load)
    base, why = (need, need_why) if need > floor else (floor, floor_why)
    if base == 0:
        return 0, "no load and no minimum"
    if scaling.buffer_containers:
        base += scaling.buffer_containers
        why += f", plus buffer_containers={scaling.buffer_containers}"
    if base > scaling.max_containers:
        return scaling.max_containers, why + f", capped at max_containers={scaling.max_containers}"
    return base, why


def crash_backoff_s(failures: int) -> float:
    """Rule 6: after `failures` containers in a row failed before they were ready, the autoscaler
    starts none until this long after the last failure: 5 s, doubling, at most 5 min (Kubernetes'
    CrashLoopBackOff). A broken app is not restarted in a tight loop, and a start asked for by a load
    sample older than the failure (its call failed with the container) is not made. Calls still
    start containers themselves (the gateway's fast path), so a caller always sees the reason."""
    if failures <= 0:
        return 0.0
    return min(300.0, 5.0 * 2 ** min(failures - 1, 10))


def decide(scaling: Scaling, boxes: Sequence[Box], load: Load, now: dt.datetime,
           held_until: float = 0.0) -> Decision:
    """The containers to start and to stop now (level triggered: the same inputs, the same answer).
    `held_until`: unix seconds before which nothing is started (rule 6)."""
    desired, why = desired_of(scaling, load, now)
    live = [b for b in boxes if b.status in LIVE and not b.stopping]
    if len(live) < desired:  # rule 4
        if now.timestamp() < held_until:
            return Decision(desired, len(live), 0, "", held_s=held_until - now.timestamp())
        return Decision(desired, len(live), desired - len(live), f"{why} ({len(live)} live)")
    return Decision(desired, len(live), 0, "", stops(scaling, live, desired, load, now.timestamp()))


def stops(scaling: Scaling, live: Sequence[Box], desired: int, load: Load, now: float) -> tuple[Stop, ...]:
    """Rule 5: idle ready containers beyond `desired`, the longest idle first."""
    if not load.known or len(live) <= desired:
        return ()
    idle = sorted((b for b in live if b.status == "ready" and b.inflight == 0 and b.idle_since is not None),
                  key=lambda b: (b.idle_since, b.container_id))
    over_max = max(0, len(live) - scaling.max_containers)
    out: list[Stop] = []
    for b in idle:
        if len(out) >= len(live) - desired:
            break
        assert b.idle_since is not None
        idle_for = now - b.idle_since
        if len(out) < over_max:
            out.append(Stop(b.container_id, f"above max_containers={scaling.max_containers} "
                                            f"({len(live)} live), idle {idle_for:.0f} s"))
        elif idle_for >= scaling.window:
            out.append(Stop(b.container_id, f"idle {idle_for:.0f} s (scaledown_window={scaling.window} s); "
                                            f"{desired} wanted, {len(live)} live"))
    return tuple(out)


def starts_for_waiting(waiting: int, starting: int, live: int, concurrency: int, max_containers: int) -> int:
    """The gateway's fast path of rule 4, for latency: containers to request at once for calls that
    wait with every ready container full (the starting ones will absorb `concurrency` calls each),
    never past max_containers. With full ready containers it asks for exactly what `decide` would
    (tests/unit/test_autoscaling.py); the autoscaler adds the rest (minimum, buffer, target)."""
    short = waiting - starting * concurrency
    if short <= 0:
        return 0
    return max(0, min(ceil_div(short, concurrency), max_containers - live))


def superseded(scaling: Scaling) -> Scaling:
    """An older version still active beside a newer one: it serves the calls that name it, and keeps
    nothing warm for them (no minimum, no buffer, no schedule)."""
    return msgspec.structs.replace(scaling, min_containers=0, buffer_containers=0, warm_schedule={})


def rescale(scaling: Scaling, *, min_containers: int | None = None, max_containers: int | None = None,
            buffer_containers: int | None = None, target_concurrency: int | None = None) -> Scaling:
    """The scaling after `deployments scale` (None: unchanged), checked as at deploy: a ValueError
    names the field (msgspec.convert runs the same bounds and combinations as a deployed spec)."""
    changes = {"min_containers": min_containers, "max_containers": max_containers,
               "buffer_containers": buffer_containers, "target_concurrency": target_concurrency}
    doc = {**msgspec.to_builtins(scaling), **{k: v for k, v in changes.items() if v is not None}}
    try:
        return msgspec.convert(doc, Scaling)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None
