"""Benchmark: a real projection (the scheduler's ContainersView) fed by the library's OrderedConsumer.

Starts its own NATS and Postgres (levers9.stack), then measures

  catch-up     N ContainerRequested events (over --ids distinct containers) are published first; then
               the consumer + projection start from position 0 and we time how long until the applied
               position reaches the last sequence: events/s projected, with projection writes.
  concurrent   a publisher process publishes N events at its maximum rate while the consumer applies
               them: events/s from the first publish to the last event applied, and the lag.
  latency      a publisher process offers --rate events/s for --seconds (open loop, `Bus.publish`);
               for each event, the time from the publish call to the commit of the batch that
               applied it (the handle is wrapped: stamped after `ProjectionStore.apply_batch` returns).

Each phase starts from an empty stream and a fresh Postgres schema. Targets: catch-up and
concurrent >= 5,000 events/s, latency p99 <= 20 ms at 1,000 events/s.

  python bench/bench_projection.py [--events 50000] [--rate 1000] [--seconds 10] [--batch 256]
                                   [--phases catchup,concurrent,latency] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncpg  # noqa: E402
import nats.js.errors  # noqa: E402
from _common import RESULTS, CpuMeter, log, percentiles, publish_many, servers, verdict, wait_quiet, write_results  # noqa: E402

from levers9.contracts import subjects, uuid7  # noqa: E402
from levers9.runtime.bus import Bus  # noqa: E402
from levers9.runtime.consumer import Delivery, OrderedConsumer  # noqa: E402
from levers9.runtime.projection import ProjectionStore  # noqa: E402
from levers9.runtime.telemetry import consuming_span  # noqa: E402
from levers9.runtime.views import ContainersView  # noqa: E402

HERE = Path(__file__).resolve().parent
TARGET_RATE = 5000.0
TARGET_P99_MS = 20.0


async def fresh_log(bus: Bus) -> None:
    """An empty LEVERS9 stream, so each phase's sequences start at 1."""
    try:
        await bus.js.delete_stream(subjects.STREAM)
    except nats.js.errors.NotFoundError:
        pass
    await bus.ensure_topology()


class Projector:
    """ContainersView in a fresh schema, consumed by OrderedConsumer exactly as a service wires it
    (Service.ordered_consumers + Service.apply: a consuming span around apply_batch), with the handle
    wrapped to note when each sequence was committed."""

    def __init__(self, bus: Bus, pool: asyncpg.Pool, batch: int, variant: str = "library") -> None:
        schema = "bench_" + uuid7().replace("-", "")[-12:]
        self.view = ContainersView()
        self.store = ProjectionStore(pool, schema, [self.view])
        self.bus = bus
        self.batch = batch
        self.applied_seq = 0
        self.applied_at: dict[str, float] = {}  # envelope id -> monotonic time of commit
        self.record_ids = False
        self.batches = 0
        self.timeline: list[tuple[float, int, float, int]] = []  # (commit time, last seq, handle s, size)
        self.handle_s = 0.0  # time inside the handle (apply_batch, commit included)
        self._target = 0
        self._reached = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def setup(self) -> None:
        await self.store.setup()

    async def handle(self, batch: list[Delivery]) -> None:
        started = time.monotonic()
        last = batch[-1]
        cid = last.message.envelope.correlation_id if last.message else ""
        with consuming_span(f"project {self.view.name}", last.headers, cid):
            await self.store.apply_batch(self.view, batch)
        now = time.monotonic()
        self.handle_s += now - started
        self.timeline.append((now, last.seq, now - started, len(batch)))
        self.batches += 1
        if self.record_ids:
            for d in batch:
                if d.message is not None:
                    self.applied_at.setdefault(d.message.envelope.id, now)
        self.applied_seq = max(self.applied_seq, last.seq)
        if self._target and self.applied_seq >= self._target:
            self._reached.set()

    def start(self) -> None:
        consumer = OrderedConsumer(self.bus, f"bench-{self.store.schema}", self.view.filter_subjects,
                                   position=lambda: self.store.position(self.view), handle=self.handle,
                                   batch=self.batch)
        self._task = asyncio.create_task(consumer.run(self._stop))

    async def wait_for(self, seq: int, timeout: float) -> None:
        self._target = seq
        self._reached.clear()
        if self.applied_seq >= seq:
            return
        await asyncio.wait_for(self._reached.wait(), timeout)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 10)

    async def check(self, events: int, ids: int) -> dict:
        """The projection is right, not just fast: one row per container, versions sum to the events."""
        rows, versions = await self.store.pool.fetchrow(
            f"SELECT count(*), coalesce(sum(version), 0) FROM {self.store.schema}.containers")
        position = await self.store.position(self.view)
        ok = rows == min(ids, events) and versions == events
        if not ok:
            raise AssertionError(f"projection wrong: {rows} rows, versions sum {versions}, expected "
                                 f"{min(ids, events)} rows and {events}")
        return {"rows": rows, "versions_sum": versions, "position": position}


def make_envs(n: int, ids: int, workspace: str = "bench"):
    from _publisher import make
    return [make(i, ids, workspace) for i in range(n)]


def run_publisher(nats_url: str, out: Path, **kw) -> subprocess.Popen:
    cmd = [sys.executable, str(HERE / "_publisher.py"), "--nats-url", nats_url, "--out", str(out)]
    for k, v in kw.items():
        cmd += [f"--{k}", str(v)]
    return subprocess.Popen(cmd)


async def wait_process(proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError("publisher did not finish in time")
        await asyncio.sleep(0.05)
    if proc.returncode != 0:
        raise RuntimeError(f"publisher exited with {proc.returncode}")


# ---- phases -----------------------------------------------------------------------------------------

async def catch_up(bus: Bus, pool: asyncpg.Pool, home: Path, args: argparse.Namespace,
                   variant: str) -> dict:
    await fresh_log(bus)
    t = time.perf_counter()
    envs = make_envs(args.events, args.ids)
    t_make = time.perf_counter() - t
    t = time.perf_counter()
    seqs = await publish_many(bus, envs)
    t_pub = time.perf_counter() - t
    last = max(seqs)
    log(f"catch-up: published {args.events} in {t_pub:.2f} s ({args.events / t_pub:,.0f}/s; "
        f"envelopes made in {t_make:.2f} s)")
    p = Projector(bus, pool, args.batch, variant)
    await p.setup()
    profiler = cProfile.Profile() if args.profile else None
    cpu = CpuMeter(home).start()
    t0 = time.monotonic()
    if profiler:
        profiler.enable()
    p.start()
    await p.wait_for(last, timeout=170)
    elapsed = time.monotonic() - t0
    if profiler:
        profiler.disable()
    cores = cpu.stop()
    await p.stop()
    check = await p.check(args.events, args.ids)
    rate = args.events / elapsed
    log(f"[{variant}] catch-up: applied {args.events} in {elapsed:.2f} s = {rate:,.0f} events/s "
        f"({p.batches} batches, {p.handle_s / elapsed:.0%} of the time in apply_batch; cores used {cores})  "
        f"target {TARGET_RATE:,.0f}: {verdict(rate, TARGET_RATE)}")
    doc = {"events": args.events, "distinct_containers": args.ids, "batch": args.batch,
           "publish_rate": round(args.events / t_pub, 1), "seconds": round(elapsed, 3),
           "events_per_s": round(rate, 1), "events_per_s_by_tenth": by_tenth(p.timeline, t0, args.events),
           "batches": p.batches, "in_apply_batch_fraction": round(p.handle_s / elapsed, 3), "cores_used": cores,
           "check": check, "target_events_per_s": TARGET_RATE, "verdict": verdict(rate, TARGET_RATE)}
    if profiler:
        doc["profile"] = dump_profile(profiler, "bench_projection_catchup")
    return doc


async def concurrent(bus: Bus, pool: asyncpg.Pool, home: Path, args: argparse.Namespace,
                     variant: str) -> dict:
    await fresh_log(bus)
    p = Projector(bus, pool, args.batch, variant)
    await p.setup()
    p.start()
    await asyncio.sleep(0.5)  # subscribed and idle before the first event
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pub.json"
        proc = run_publisher(bus_url(bus), out, mode="max", events=args.events, ids=args.ids)
        cpu = CpuMeter(home, [proc.pid]).start()
        await wait_process(proc, 170)
        pub = json.loads(out.read_text())
    lag_at_end = pub["last_seq"] - p.applied_seq
    await p.wait_for(pub["last_seq"], timeout=170)
    done = time.monotonic()
    cores = cpu.stop()
    await p.stop()
    check = await p.check(args.events, args.ids)
    elapsed = done - pub["t_start"]
    rate = args.events / elapsed
    log(f"[{variant}] concurrent: published at {pub['publish_rate']:,.0f}/s; all {args.events} applied "
        f"{elapsed:.2f} s after the first publish = {rate:,.0f} events/s (lag when publishing ended: "
        f"{lag_at_end} events; {p.handle_s / elapsed:.0%} of the time in apply_batch; cores used {cores})  "
        f"target {TARGET_RATE:,.0f}: {verdict(rate, TARGET_RATE)}")
    return {"events": args.events, "batch": args.batch, "publish_rate": pub["publish_rate"],
            "seconds": round(elapsed, 3), "events_per_s": round(rate, 1), "lag_when_publishing_ended": lag_at_end,
            "in_apply_batch_fraction": round(p.handle_s / elapsed, 3),
            "cores_used": cores, "check": check, "target_events_per_s": TARGET_RATE,
            "verdict": verdict(rate, TARGET_RATE)}


async def latency(bus: Bus, pool: asyncpg.Pool, home: Path, args: argparse.Namespace,
                  variant: str) -> dict:
    await fresh_log(bus)
    p = Projector(bus, pool, args.batch, variant)
    await p.setup()
    p.start()
    warm = make_envs(50, args.ids, "warmup")  # prepared statements, connections, subscription
    await publish_many(bus, warm)
    await p.wait_for(50, timeout=30)
    await asyncio.sleep(1.2)  # let the consumer go idle (a lingering pull), as it would be in service
    p.record_ids = True
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pub.json"
        proc = run_publisher(bus_url(bus), out, mode="paced", rate=args.rate, seconds=args.seconds, ids=args.ids)
        cpu = CpuMeter(home, [proc.pid]).start()
        await wait_process(proc, args.seconds + 60)
        pub = json.loads(out.read_text())
    last = max(r[3] for r in pub["records"])
    await p.wait_for(last, timeout=60)
    cores = cpu.stop()
    await p.stop()
    e2e = [(p.applied_at[r[0]] - r[1]) * 1000 for r in pub["records"]]
    acks = [(r[2] - r[1]) * 1000 for r in pub["records"]]
    # where the slow ones are: per second of the run, p99 and max (stalls show up as one bad second)
    by_second: dict[int, list[float]] = {}
    for r, ms in zip(pub["records"], e2e):
        by_second.setdefault(int(r[1] - pub["t_start"]), []).append(ms)
    keep = ("n", "p50_ms", "p99_ms", "max_ms")
    per_second = [{"second": k, **{x: v for x, v in percentiles(vs).items() if x in keep}}
                  for k, vs in sorted(by_second.items())]
    # the parts of it: publish -> ack (NATS stored it), ack -> applied (consumer fetch + apply + commit)
    after_ack = [(p.applied_at[r[0]] - r[2]) * 1000 for r in pub["records"]]
    # the consumer's cycle: time in apply_batch (Postgres, commit included) and between two commits
    window = [x for x in p.timeline if x[0] >= pub["t_start"]]
    apply_ms = [x[2] * 1000 for x in window]
    cycle_ms = [(b[0] - a[0]) * 1000 for a, b in zip(window, window[1:])]
    stats = percentiles(e2e)
    log(f"[{variant}] latency at {args.rate:,.0f}/s offered ({pub['achieved_rate']:,.0f}/s achieved, "
        f"{len(e2e)} events): "
        f"publish->applied p50 {stats['p50_ms']} ms, p90 {stats['p90_ms']} ms, p99 {stats['p99_ms']} ms, "
        f"max {stats['max_ms']} ms  (publish ack alone p99 {percentiles(acks)['p99_ms']} ms; apply_batch p50/p99 "
        f"{percentiles(apply_ms)['p50_ms']}/{percentiles(apply_ms)['p99_ms']} ms; "
        f"{len(window)} batches; cores used {cores})  target p99 <= {TARGET_P99_MS} ms: "
        f"{verdict(stats['p99_ms'], TARGET_P99_MS, higher_is_better=False)}")
    return {"offered_rate": args.rate, "achieved_rate": pub["achieved_rate"], "seconds": args.seconds,
            "batch": args.batch, "publish_to_applied": stats, "publish_ack": percentiles(acks),
            "ack_to_applied": percentiles(after_ack), "apply_batch": percentiles(apply_ms),
            "commit_to_commit": percentiles(cycle_ms), "per_second": per_second,
            "max_schedule_slip_ms": pub["max_schedule_slip_ms"], "batches": len(window),
            "mean_batch_size": round(len(e2e) / max(1, len(window)), 1), "cores_used": cores,
            "target_p99_ms": TARGET_P99_MS,
            "verdict": verdict(stats["p99_ms"], TARGET_P99_MS, higher_is_better=False)}


def by_tenth(timeline: list[tuple[float, int, float, int]], t0: float, events: int) -> list[float]:
    """events/s over each tenth of the run (by events applied): shows warm-up or slowing down."""
    out, prev_t, prev_n, n = [], t0, 0, 0
    for t, _seq, _h, size in timeline:
        n += size
        if n >= (len(out) + 1) * events / 10:
            out.append(round((n - prev_n) / max(1e-9, t - prev_t)))
            prev_t, prev_n = t, n
    return out


def bus_url(bus: Bus) -> str:
    return bus.nc.connected_url.geturl()


def dump_profile(profiler: cProfile.Profile, name: str, top: int = 30) -> dict:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.prof"
    profiler.dump_stats(str(path))
    text = {}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).strip_dirs().sort_stats(key).print_stats(top)
        text[key] = buf.getvalue()
    log(f"profile (by own time) of the consumer process:\n{text['tottime']}")
    log(f"profile (cumulative):\n{text['cumulative']}")
    return {"pstats_file": str(path)}


PHASES = {"catchup": (catch_up, "events_per_s", True), "concurrent": (concurrent, "events_per_s", True),
          "latency": (latency, "p99_ms", False)}


def key_of(phase: str, doc: dict) -> float:
    return doc["publish_to_applied"]["p99_ms"] if phase == "latency" else doc["events_per_s"]


async def main(args: argparse.Namespace) -> dict:
    """Every round runs every phase for every variant, alternating, so a change in the machine's
    background load (it is shared) hits the variants alike; per variant and phase the median run is
    kept, with the figure of each run beside it."""
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    variants = [x.strip() for x in args.variants.split(",") if x.strip()]
    runs: dict[str, dict[str, list[dict]]] = {v: {ph: [] for ph in phases} for v in variants}
    with servers(args.with_s3) as (urls, home):
        bus = await Bus.connect(urls["nats_url"], name="levers9-bench")
        # the pool a service creates (Service.connect)
        pool = await asyncpg.create_pool(urls["database_url"], min_size=1, max_size=8)
        try:
            for rnd in range(args.rounds):
                for phase in phases:
                    for variant in variants:
                        background = wait_quiet(args.max_wait_quiet) if args.max_wait_quiet > 0 else None
                        doc = await PHASES[phase][0](bus, pool, home, args, variant)
                        doc["background_cores_at_start"] = background
                        doc["round"] = rnd + 1
                        runs[variant][phase].append(doc)
        finally:
            await pool.close()
            await bus.close()
    results: dict = {"args": dict(vars(args))}
    for variant in variants:
        results[variant] = {}
        for phase in phases:
            docs = sorted(runs[variant][phase], key=lambda d, ph=phase: key_of(ph, d))
            # the middle run; with an even count, the worse of the two middle ones
            median = dict(docs[(len(docs) - 1) // 2] if PHASES[phase][2] else docs[len(docs) // 2])
            median["runs"] = [key_of(phase, d) for d in runs[variant][phase]]
            median["background_cores_runs"] = [d["background_cores_at_start"] for d in runs[variant][phase]]
            results[variant][phase] = median
    log(f"\nmedian of {args.rounds} round(s), per variant:")
    for variant in variants:
        for phase in phases:
            d = results[variant][phase]
            unit = "ms p99" if phase == "latency" else "events/s"
            log(f"  {variant:<22} {phase:<11} {key_of(phase, d):>10,.1f} {unit}  runs {d['runs']}  {d['verdict']}")
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=50_000, help="events for the throughput phases")
    ap.add_argument("--ids", type=int, default=5000, help="distinct container ids")
    ap.add_argument("--rate", type=float, default=1000, help="offered load of the latency phase, events/s")
    ap.add_argument("--seconds", type=float, default=10, help="length of the latency phase")
    ap.add_argument("--batch", type=int, default=256, help="OrderedConsumer batch (the services' fetch_batch)")
    ap.add_argument("--phases", default="catchup,concurrent,latency")
    ap.add_argument("--profile", action="store_true", help="cProfile the catch-up consumer")
    ap.add_argument("--with-s3", action="store_true", help="also start SeaweedFS, as `levers9 up` does")
    ap.add_argument("--max-wait-quiet", type=float, default=30,
                    help="before each phase wait up to this many seconds for other load on the machine to "
                         "drop below 0.3 cores (0: don't wait)")
    ap.add_argument("--rounds", type=int, default=1, help="run everything this many times; medians reported")
    ap.add_argument("--variants", default="library",
                    help="library (the code as it is). The prototypes once compared with it (batched "
                         "statements, async commit) are in the library now, so it is the only variant")
    ap.add_argument("--name", help="results file name (bench/results/NAME.json); default bench_projection, "
                                   "or bench_projection_ab when a variant other than library is run")
    a = ap.parse_args()
    for v in a.variants.split(","):
        if v.strip() != "library":
            ap.error(f"unknown variant {v!r}")
    a.name = a.name or ("bench_projection" if a.variants == "library" else "bench_projection_ab")
    started = time.perf_counter()
    res = asyncio.run(main(a))
    res["wall_s"] = round(time.perf_counter() - started, 1)
    write_results(a.name, res)
