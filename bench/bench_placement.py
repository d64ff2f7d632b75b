"""Benchmark: the scheduler's placements, against real NATS and Postgres and the real scheduler process.

Starts its own NATS and Postgres (levers9.stack, through _common.servers) and one scheduler process
(`python -m levers9 service scheduler`, as `levers9 up` starts it). Workers are only events: the
bench publishes WorkerRegistered + WorkerReady for each; nothing starts. Two phases:

  latency     10 workers (pool `lat`, 16 cores each); --latency-requests ContainerRequested, one at a
              time: publish one, wait for its ContainerScheduled, pause --gap ms, next. Per request:
              the time from the publish call to the bench receiving ContainerScheduled (a core NATS
              subscription), and ContainerRequested.occurred_at -> ContainerScheduled.occurred_at
              (the `placement` phase of bench_cold_call.py). Targets: p50 <= 10 ms, p99 <= 30 ms.
  throughput  100 workers (pool `default`, 16 cores and 64 GiB each); --requests ContainerRequested
              (250m, 256 MiB: 64 fit a worker, so 5,000 fill 79 of them) published at once
              (publish_async), so they queue; placements/s from the first publish to the last
              ContainerScheduled received, and each request's publish -> ContainerScheduled.
              Target: >= 2,000 placements/s. Then checks: every container scheduled exactly once;
              the reservations in the log, replayed in order, never take more than a worker has;
              and how long the scheduler's projection took to catch up.
  --backlog   the throughput requests are published before the scheduler starts (a backlog it
              recovers at start): placements/s from the process start to the last placement.

  python bench/bench_placement.py [--requests 5000] [--workers 100] [--latency-requests 200] [--backlog]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncpg  # noqa: E402
import httpx  # noqa: E402
from _common import CpuMeter, cpu_seconds, log, percentiles, publish_many, servers, verdict, wait_quiet, write_results  # noqa: E402

from levers9.contracts import SYSTEM_WORKSPACE, envelope, subjects  # noqa: E402
from levers9.contracts import events as E  # noqa: E402
from levers9.contracts.spec import Code, DeploymentSpec, Resources  # noqa: E402
from levers9.runtime.bus import Bus  # noqa: E402
from levers9.runtime.reader import read  # noqa: E402
from levers9.stack import free_port  # noqa: E402

TARGET_RATE = 2000.0
TARGET_P50_MS = 10.0
TARGET_P99_MS = 30.0
SPEC = DeploymentSpec(name="bench-placement", code=Code(module="app", handler="handler"),
                      resources=Resources(cpu_millicores=250, memory_mib=256))


def parse_ts(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class Scheduler:
    """The scheduler service as a child process, its log in the bench home."""

    def __init__(self, urls: dict[str, str], home: Path) -> None:
        self.port = free_port()
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")},
                    "LEVERS9_HOME": str(home), "LEVERS9_NATS_URL": urls["nats_url"],
                    "LEVERS9_DATABASE_URL": urls["database_url"], "LEVERS9_HTTP_PORT": str(self.port),
                    "LEVERS9_SERVICE": "scheduler", "LEVERS9_LOG_LEVEL": "WARNING",
                    **{k: v for k, v in os.environ.items() if k == "LEVERS9_FETCH_BATCH"}}
        self.home = home
        self.log_path = home / "scheduler.log"
        self.proc: subprocess.Popen | None = None
        self.started = 0.0

    def start(self, profile: Path | None = None) -> None:
        self.started = time.perf_counter()
        prefix = ["-m", "cProfile", "-o", str(profile)] if profile else []
        self.proc = subprocess.Popen([sys.executable, *prefix, "-m", "levers9", "service", "scheduler"], env=self.env,
                                     stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT)

    def health(self) -> dict | None:
        try:
            r = httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    async def wait(self, condition, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise SystemExit(f"the scheduler exited ({self.proc.returncode}); see {self.log_path}")
            h = await asyncio.to_thread(self.health)
            if h is not None and condition(h):
                return h
            await asyncio.sleep(0.05)
        raise SystemExit(f"the scheduler did not get there in {timeout} s (health: {self.health()}); "
                         f"see {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class Placements:
    """ContainerScheduled as the bench sees them: a core subscription, the receive time of each."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.occurred: dict[str, str] = {}
        self.duplicates = 0
        self.arrived = asyncio.Event()
        self.sub = None

    async def start(self, bus: Bus) -> None:
        async def on_msg(msg) -> None:
            now = time.perf_counter()
            doc = json.loads(msg.data)
            cid = doc["data"]["container_id"]
            if cid in self.at:
                self.duplicates += 1
            self.at.setdefault(cid, now)
            self.occurred.setdefault(cid, doc["occurred_at"])
            self.arrived.set()

        self.sub = await bus.nc.subscribe(subjects.filter_subject(aggregate="container",
                                                                  event_type="ContainerScheduled"), cb=on_msg)

    async def wait_for(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.at) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass
        return True


def request(cid: str, pool: str) -> E.ContainerRequested:
    return E.ContainerRequested(container_id=cid, deployment_id="bench-dep", deployment_version=1,
                                resources=SPEC.resources, pool=pool, spec=SPEC, note="cold: bench")


async def publish_workers(bus: Bus, pool: str, count: int, cpu: int, memory: int) -> list[str]:
    ids = [f"{pool}-{i:03d}-{uuid.uuid4().hex[:6]}" for i in range(count)]
    envs = []
    for w in ids:
        envs.append(envelope(E.WorkerRegistered(worker_id=w, pool=pool, cpu_millicores=cpu, memory_mib=memory,
                                                features=["runc"]), workspace=SYSTEM_WORKSPACE))
        envs.append(envelope(E.WorkerReady(worker_id=w), workspace=SYSTEM_WORKSPACE))
    await publish_many(bus, envs)
    return ids


async def latency_phase(bus: Bus, seen: Placements, n: int, gap_ms: float) -> dict:
    wall, placement = [], []
    for _ in range(n):
        cid = str(uuid.uuid4())
        env = envelope(request(cid, "lat"), workspace="default")
        t0 = time.perf_counter()
        await bus.publish(env)
        if not await _wait_one(seen, cid, 10.0):
            raise SystemExit(f"{cid} was not scheduled within 10 s")
        wall.append((seen.at[cid] - t0) * 1000)
        placement.append((parse_ts(seen.occurred[cid]) - parse_ts(env.occurred_at)) * 1000)
        await asyncio.sleep(gap_ms / 1000)
    return {"requests": n, "gap_ms": gap_ms, "publish_to_scheduled": percentiles(wall),
            "requested_to_scheduled_occurred_at": percentiles(placement),
            "samples_ms": [round(x, 2) for x in placement]}


async def _wait_one(seen: Placements, cid: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while cid not in seen.at and time.monotonic() < deadline:
        await seen.wait_for(len(seen.at) + 1, deadline - time.monotonic())
    return cid in seen.at


async def replay_capacity(bus: Bus, workers: list[str], cpu: int) -> dict:
    """Replay every reservation and release of the workers in log order, as the projection counts."""
    used: dict[str, int] = {}
    slots: dict[tuple[str, str], tuple[int, int]] = {}
    over = 0
    filters = [subjects.filter_subject(workspace=SYSTEM_WORKSPACE, aggregate="worker")]
    known = set(workers)
    async for msgs in read(bus, filters):
        for m in msgs:
            doc = json.loads(m.data)
            data = doc["data"]
            if data.get("worker_id") not in known:
                continue
            key = (data["worker_id"], data.get("container_id", ""))
            if doc["type"] == "WorkerSlotReserved" and key not in slots:
                slots[key] = (m.metadata.sequence.stream, data["cpu_millicores"])
                used[key[0]] = used.get(key[0], 0) + data["cpu_millicores"]
                over += used[key[0]] > cpu
            elif doc["type"] == "WorkerSlotReleased" and key in slots and data["reserved_seq"] in (0, slots[key][0]):
                used[key[0]] -= slots.pop(key)[1]
    return {"reservations_held": len(slots), "workers_used": len(used), "overbooked_moments": over,
            "max_used_millicores": max(used.values(), default=0)}


async def projection_caught_up(database_url: str, count: int, timeout: float = 120.0) -> float:
    started = time.perf_counter()
    conn = await asyncpg.connect(database_url)
    try:
        while time.perf_counter() - started < timeout:
            n = await conn.fetchval("SELECT count(*) FROM scheduler.containers WHERE status = 'scheduled' "
                                    "AND pool = 'default'")
            if n >= count:
                return time.perf_counter() - started
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    return float("nan")


async def throughput_phase(bus: Bus, sched: Scheduler, seen: Placements, args, workers: list[str]) -> dict:
    cids = [str(uuid.uuid4()) for _ in range(args.requests)]
    envs = [envelope(request(cid, "default"), workspace="default") for cid in cids]
    before = len(seen.at)
    if args.backlog:
        await publish_many(bus, envs)
        log(f"{len(envs)} requests queued; starting the scheduler")
        t0 = time.perf_counter()
        sched.start(args.profile)
        published = {cid: t0 for cid in cids}
    else:
        t0 = time.perf_counter()
        await publish_many(bus, envs)
        published = {cid: t0 for cid in cids}  # a burst: all queued at once
    published_s = time.perf_counter() - t0
    cpu0 = cpu_seconds(sched.proc.pid) if sched.proc else 0.0
    meter = CpuMeter(sched.home, extra_pids=[sched.proc.pid] if sched.proc else []).start()
    ok = await seen.wait_for(before + args.requests, timeout=300)
    cores = meter.stop()
    cores["scheduler"] = cores.pop("publisher", 0.0)
    ours = [seen.at[c] for c in cids if c in seen.at]
    if not ok or len(ours) < args.requests:
        raise SystemExit(f"only {len(ours)} of {args.requests} scheduled within 300 s")
    elapsed = max(ours) - t0
    cpu = cpu_seconds(sched.proc.pid) - cpu0 if sched.proc else 0.0
    rate = args.requests / elapsed
    waits = [(seen.at[c] - published[c]) * 1000 for c in cids]
    timeline = [0] * (int(elapsed / 0.25) + 1)  # placements per quarter second since the first publish
    for at in ours:
        timeline[int((at - t0) / 0.25)] += 1
    projection_s = await projection_caught_up(sched.env["LEVERS9_DATABASE_URL"], args.requests)
    health = sched.health() or {}
    return {"requests": args.requests, "workers": len(workers), "mode": "backlog" if args.backlog else "burst",
            "publish_s": round(published_s, 3), "elapsed_s": round(elapsed, 3),
            "placements_per_s": round(rate, 1), "verdict": verdict(rate, TARGET_RATE),
            # the rate once placing started (in --backlog mode: without the process start)
            "first_to_last_per_s": round((len(ours) - 1) / max(1e-9, max(ours) - min(ours)), 1),
            "request_to_scheduled": percentiles(waits), "duplicates": seen.duplicates,
            "placed_per_quarter_second": timeline,
            "scheduler_cpu_cores": round(cpu / elapsed, 2) if elapsed else None,
            "scheduler_cpu_ms_per_placement": round(cpu * 1000 / args.requests, 3),
            "cores_while_placing": cores,
            "projection_caught_up_after_s": round(projection_s, 3), "scheduler_health": health}


async def run(args) -> dict:
    with servers() as (urls, home):
        bus = await Bus.connect(urls["nats_url"])
        await bus.ensure_topology()
        sched = Scheduler(urls, home)
        seen = Placements()
        await seen.start(bus)
        try:
            lat_workers = await publish_workers(bus, "lat", 10, 16000, 65536)
            workers = await publish_workers(bus, "default", args.workers, 16000, 65536)
            out: dict = {}
            if not args.backlog:
                sched.start(args.profile)
                await sched.wait(lambda h: h.get("workers", 0) >= len(workers) + len(lat_workers))
                out["background_cores"] = wait_quiet(max_wait=20)
                log("latency phase")
                out["latency"] = await latency_phase(bus, seen, args.latency_requests, args.gap)
                out["latency"]["scheduler_health"] = sched.health()
                log(f"latency: {json.dumps({k: v for k, v in out['latency'].items() if k != 'samples_ms'})}")
            if args.requests:
                log("throughput phase")
                out["throughput"] = await throughput_phase(bus, sched, seen, args, workers)
                log(f"throughput: {json.dumps(out['throughput'])}")
                out["capacity_replayed"] = await replay_capacity(bus, workers, 16000)
            return out
        finally:
            sched.stop()
            await bus.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=100)
    ap.add_argument("--latency-requests", type=int, default=200)
    ap.add_argument("--gap", type=float, default=20.0, help="ms between latency requests")
    ap.add_argument("--backlog", action="store_true", help="queue the requests before the scheduler starts")
    ap.add_argument("--profile", type=Path, default=None, help="run the scheduler under cProfile, stats to FILE")
    args = ap.parse_args()
    doc = asyncio.run(run(args))
    if args.profile:
        import pstats
        pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(35)
    lat = doc.get("latency", {}).get("requested_to_scheduled_occurred_at", {})
    summary = {"placements_per_s": doc.get("throughput", {}).get("placements_per_s"), "target_rate": TARGET_RATE,
               "latency_p50_ms": lat.get("p50_ms"), "latency_p99_ms": lat.get("p99_ms"),
               "target_p50_ms": TARGET_P50_MS, "target_p99_ms": TARGET_P99_MS}
    if lat:
        summary["latency_verdict"] = (verdict(lat["p50_ms"], TARGET_P50_MS, higher_is_better=False) + "/" +
                                      verdict(lat["p99_ms"], TARGET_P99_MS, higher_is_better=False))
    write_results("placement_backlog" if args.backlog else "placement", {"summary": summary, **doc})
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
