"""What the image-builder decides, as pure functions over plain values (no I/O).

`plan` looks at every build that waits for a builder, or whose builder is gone, or that ran too long,
and says what to append: start it on a worker of the build pool (with how many steps the layer cache
already holds), fail it with a reason, or keep waiting (and say so now and then). Its order:
a build whose builder was lost is given again first (it waited longest), then the requests, oldest
first; each worker takes one build at a time.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import AbstractSet, Sequence

from levers9.contracts.images import BUILD_POOL, BuildStep, build_steps, cached_prefix
from levers9.contracts.spec import ImageSpec

WAIT_FOR_BUILDER_S = 600.0  # a build nobody can take fails after this, saying why
BUILD_TIMEOUT_S = 3600.0  # a builder that stays silent this long is not coming back with an image
MAX_ATTEMPTS = 3  # builders lost in the middle of one build before it fails
SAY_WAITING_EVERY_S = 15.0
GONE = ("lost", "drained")


@dataclass(frozen=True)
class Worker:
    worker_id: str
    pool: str
    status: str
    cordoned: bool = False
    cpu_millicores: int = 0


@dataclass(frozen=True)
class Build:
    workspace: str
    image_id: str
    status: str  # requested | building | pushed | built | failed | deleted
    blueprint: ImageSpec
    last_seq: int  # the expected version of the next append
    builder: str = ""
    attempt: int = 0
    requested_at: dt.datetime | None = None
    started_at: dt.datetime | None = None


@dataclass(frozen=True)
class Start:
    build: Build
    builder: str
    attempt: int
    steps: list[BuildStep]
    cached_steps: int


@dataclass(frozen=True)
class Fail:
    build: Build
    reason: str


@dataclass(frozen=True)
class Wait:
    build: Build
    message: str


Decision = Start | Fail | Wait


def ready_builders(workers: Sequence[Worker], busy: set[str], excluded: AbstractSet[str] = frozenset()) -> list[Worker]:
    """Workers that may take a build now: in the build pool, ready, not cordoned, not building
    anything, not excluded (the one just lost); most CPU first (a build is mostly pip and apt)."""
    fit = [w for w in workers if w.pool == BUILD_POOL and w.status == "ready" and not w.cordoned
           and w.worker_id not in busy and w.worker_id not in excluded]
    return sorted(fit, key=lambda w: (-w.cpu_millicores, w.worker_id))


def choose_builder(workers: Sequence[Worker], busy: set[str], excluded: AbstractSet[str] = frozenset()) -> str | None:
    ready = ready_builders(workers, busy, excluded)
    return ready[0].worker_id if ready else None


def busy_builders(builds: Sequence[Build]) -> set[str]:
    return {b.builder for b in builds if b.status == "building" and b.builder}


def _waited(since: dt.datetime | None, now: dt.datetime) -> float:
    return (now - since).total_seconds() if since else 0.0


def _lost(build: Build, workers: dict[str, Worker]) -> bool:
    worker = workers.get(build.builder)
    return build.status == "building" and (worker is None or worker.status in GONE)


def plan(builds: Sequence[Build], workers: Sequence[Worker], cached: set[str], now: dt.datetime,
         last_said: dict[str, dt.datetime] | None = None) -> list[Decision]:
    """The decisions for this pass. `cached`: step hashes the layer cache holds; `last_said`: when
    each waiting build was last told it waits (absent: never)."""
    by_id = {w.worker_id: w for w in workers}
    busy = busy_builders([b for b in builds if not _lost(b, by_id)])
    lost = [b for b in builds if _lost(b, by_id)]
    requested = sorted((b for b in builds if b.status == "requested"),
                       key=lambda b: (b.requested_at or now, b.image_id))
    out: list[Decision] = []
    for b in builds:  # 1. a builder silent for too long
        if b.status == "building" and not _lost(b, by_id) and _waited(b.started_at, now) > BUILD_TIMEOUT_S:
            out.append(Fail(b, f"the build on {b.builder} did not finish within {BUILD_TIMEOUT_S:.0f} s"))
    for b in lost + requested:  # 2. lost builders' builds, then requests, oldest first
        excluded = {b.builder} if b.builder else set()
        if b.builder and b.attempt >= MAX_ATTEMPTS:
            out.append(Fail(b, f"its builder {b.builder} was lost (attempt {b.attempt} of {MAX_ATTEMPTS})"))
            continue
        builder = choose_builder(workers, busy, excluded)
        if builder is not None:
            busy.add(builder)
            steps = build_steps(b.blueprint)
            out.append(Start(b, builder, b.attempt + 1, steps, cached_prefix(steps, cached)))
            continue
        since = b.started_at if b.builder else b.requested_at
        if _waited(since, now) > WAIT_FOR_BUILDER_S:
            out.append(Fail(b, no_builder_reason(workers)))
        elif _waited((last_said or {}).get(b.image_id), now) >= SAY_WAITING_EVERY_S or \
                b.image_id not in (last_said or {}):
            out.append(Wait(b, waiting_message(workers, busy)))
    return out


def waiting_message(workers: Sequence[Worker], busy: set[str]) -> str:
    pool = [w for w in workers if w.pool == BUILD_POOL]
    ready = [w for w in pool if w.status == "ready" and not w.cordoned]
    if not pool:
        return f"waiting for a worker of pool {BUILD_POOL!r}: none exists yet (the pool controller starts one)"
    if not ready:
        return f"waiting for a worker of pool {BUILD_POOL!r}: {len(pool)} known, none ready yet"
    return f"waiting for a worker of pool {BUILD_POOL!r}: all {len(ready)} ready ones are building"


def no_builder_reason(workers: Sequence[Worker]) -> str:
    return (f"no worker of pool {BUILD_POOL!r} could take the build within {WAIT_FOR_BUILDER_S:.0f} s "
            f"({waiting_message(workers, set()).split(': ', 1)[1]}): check the pools file and "
            "`levers9 workers list`")
