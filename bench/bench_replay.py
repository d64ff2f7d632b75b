"""Benchmark: replaying the log, in-process (`levers9.runtime.reader.read`) and with the CLI
(`levers9 events replay --json`), against a real NATS server started for the run.

The log: --events (default 100,000) events of realistic lifecycles in several workspaces: per container
ContainerRequested -> ContainerScheduled -> ContainerStarted -> ContainerReady -> ContainerStopped,
each lifecycle one correlation, plus DeploymentCreated and platform (_sys) worker events. Published
concurrently (publish_async with Nats-Msg-Id = envelope id) to make the setup quick.

Measured (each --repeat times, median reported; with several --variants, alternately):
  reader            the loop `async for msgs in read(bus)` over every message (what `replay` builds on)
  reader+decode     the same, plus full `levers9.contracts.decode` of each message (what a rebuild does)
  cli               `python -m levers9 events replay --json > /dev/null`, the whole command
  cli --type        server-side filter: `--type ContainerRequested`
  cli --workspace   server-side filter: `--workspace acme`
  cli --correlation-id   client-side filter: reads the whole log, prints one lifecycle
  cli startup       `... --to-seq 1`: interpreter, imports, connect (included in every cli figure)
  cli table         the table output (no --json) over the first --table-events events

Target: `levers9 events replay` >= 50,000 events/s over 100k events.

  python bench/bench_replay.py [--events 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CpuMeter, log, publish_many, servers, verdict, wait_quiet, write_results  # noqa: E402

from levers9.contracts import caused_by, decode, envelope  # noqa: E402
from levers9.contracts import events as E  # noqa: E402
from levers9.contracts.spec import Code, DeploymentSpec, Resources  # noqa: E402

RESOURCES = Resources(cpu_millicores=500, memory_mib=512)
from levers9.runtime.bus import Bus  # noqa: E402
from levers9.runtime.reader import read  # noqa: E402

TARGET = 50_000.0
WORKSPACES = ("acme", "globex", "initech", "umbrella", "hooli")


def make_log(n: int) -> list:
    """About n envelopes: whole lifecycles, interleaved across workspaces like a busy system."""
    out = []
    i = 0
    spec = DeploymentSpec(name="app0", code=Code(module="app", handler="handler"), resources=RESOURCES)
    while len(out) < n:
        ws = WORKSPACES[i % len(WORKSPACES)]
        worker = f"worker-{i % 40:02d}"
        if i % 500 == 0:  # now and then a deployment and a worker coming up
            spec = DeploymentSpec(name=f"app{i // 500}", code=Code(module="app", handler="handler"),
                                  resources=RESOURCES)
            out.append(envelope(E.DeploymentCreated(deployment_id=f"d{i // 500:04d}", name=f"app{i // 500}",
                                                    spec=spec), workspace=ws))
            out.append(envelope(E.WorkerRegistered(worker_id=worker, cpu_millicores=16000, memory_mib=65536,
                                                   features=["runc", "criu"]), workspace=ws))
        cid = f"c{i:06d}"
        req = envelope(E.ContainerRequested(container_id=cid, deployment_id=f"d{i // 500:04d}", resources=RESOURCES,
                                            spec=spec), workspace=ws)
        sched = caused_by(req, E.ContainerScheduled(container_id=cid, worker_id=worker, resources=RESOURCES,
                                                    spec=spec))
        started = caused_by(sched, E.ContainerStarted(container_id=cid, worker_id=worker))
        ready = caused_by(started, E.ContainerReady(container_id=cid, worker_id=worker,
                                                    address=f"http://10.90.{i % 250}.2:8000"))
        stopped = caused_by(ready, E.ContainerStopped(container_id=cid, worker_id=worker, reason="idle"))
        out += [req, sched, started, ready, stopped]
        i += 1
    return out[:n]


async def time_reader(url: str, decode_too: bool, variant: str = "library") -> tuple[int, float]:
    reader = read
    bus = await Bus.connect(url, name="levers9-bench-reader")
    try:
        count = 0
        t0 = time.perf_counter()
        async for msgs in reader(bus):
            if decode_too:
                for m in msgs:
                    decode(m.data, m.subject)
            count += len(msgs)
        return count, time.perf_counter() - t0
    finally:
        await bus.close()


def time_cli(url: str, home: Path, args: list[str], variant: str = "library",
             out_path: str = os.devnull) -> tuple[int, float]:
    env = {**os.environ, "LEVERS9_NATS_URL": url, "LEVERS9_HOME": str(home), "COLUMNS": "250"}
    entry = ["-m", "levers9"]  # the real CLI
    t0 = time.perf_counter()
    with open(out_path, "wb") as out:
        proc = subprocess.run([sys.executable, *entry, "events", "replay", *args], stdout=out,
                              stderr=subprocess.PIPE, env=env, timeout=300)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"replay {args} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    m = re.search(rb"(\d+) events", proc.stderr)
    if not m:
        raise RuntimeError(f"replay {args}: no count in its stderr: {proc.stderr.decode()[-2000:]}")
    return int(m.group(1)), elapsed


def summarize(name: str, runs: list[tuple[int, float, dict]], scanned: int) -> dict:
    counts = {c for c, _, _ in runs}
    if len(counts) != 1:
        raise AssertionError(f"{name}: runs printed different counts {counts}")
    order = sorted(range(len(runs)), key=lambda i: runs[i][1])
    mid = order[len(order) // 2]  # the median run (with an even count, the slower middle one)
    med = runs[mid][1]
    doc = {"printed": runs[0][0], "read": scanned, "seconds_runs": [round(s, 3) for _, s, _ in runs],
           "seconds_median": round(med, 3), "events_per_s": round(scanned / med, 1), "cores_used": runs[mid][2]}
    log(f"  {name:<34} {runs[0][0]:>7} printed {scanned:>7} read  median {med:6.2f} s = "
        f"{scanned / med:>9,.0f} events/s  (runs {', '.join(f'{s:.2f}' for _, s, _ in runs)} s; cores {runs[mid][2]})")
    return doc


async def main(args: argparse.Namespace) -> dict:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    res: dict = {"args": dict(vars(args))}
    with servers(args.with_s3) as (urls, home):
        url = urls["nats_url"]
        bus = await Bus.connect(url, name="levers9-bench")
        await bus.ensure_topology()
        t = time.perf_counter()
        envs = make_log(args.events)
        t_make = time.perf_counter() - t
        t = time.perf_counter()
        for start in range(0, len(envs), 20_000):
            await publish_many(bus, envs[start:start + 20_000])
        t_pub = time.perf_counter() - t
        info = await bus.js.stream_info("LEVERS9")
        await bus.close()
        n = info.state.messages
        assert n == args.events, f"the stream holds {n} messages, expected {args.events}"
        log(f"log: {n} events, {info.state.bytes / 1e6:.1f} MB, made in {t_make:.1f} s, published in "
            f"{t_pub:.1f} s ({n / t_pub:,.0f}/s)")
        res["log"] = {"events": n, "bytes": info.state.bytes, "publish_rate": round(n / t_pub, 1),
                      "types": sorted({e.type for e in envs}), "workspaces": sorted({e.workspace for e in envs})}
        n_requested = sum(1 for e in envs if e.type == "ContainerRequested")
        n_acme = sum(1 for e in envs if e.workspace == "acme")
        cid = envs[len(envs) // 2].correlation_id
        n_cid = sum(1 for e in envs if e.correlation_id == cid)
        res["background_cores_at_start"] = wait_quiet(args.max_wait_quiet) if args.max_wait_quiet > 0 else None

        async def reader_run(variant: str, decode_too: bool) -> tuple[int, float, dict]:
            meter = CpuMeter(home).start()
            count, secs = await time_reader(url, decode_too, variant)
            return count, secs, meter.stop()

        async def cli_run(variant: str, cli_args: list[str]) -> tuple[int, float, dict]:
            meter = CpuMeter(home).start()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            count, secs = await asyncio.to_thread(time_cli, url, home, cli_args, variant)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cores = meter.stop()
            child = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / secs
            cores["cli_process"] = round(child, 2)  # the meter counted it in everything_else: take it out
            cores["everything_else"] = round(max(0.0, cores["everything_else"] - child), 2)
            return count, secs, cores

        measurements = [
            ("reader", "reader (in-process)", n, n, lambda v: reader_run(v, False)),
            ("reader_decode", "reader + decode", n, n, lambda v: reader_run(v, True)),
            ("cli_startup", "cli startup (--to-seq 1)", 1, 1, lambda v: cli_run(v, ["--json", "--to-seq", "1"])),
            ("cli", "cli --json", n, n, lambda v: cli_run(v, ["--json"])),
            ("cli_type", "cli --json --type ContainerRequested", n_requested, n_requested,
             lambda v: cli_run(v, ["--json", "--type", "ContainerRequested"])),
            ("cli_workspace", "cli --json --workspace acme", n_acme, n_acme,
             lambda v: cli_run(v, ["--json", "--workspace", "acme"])),
            ("cli_correlation", "cli --json --correlation-id", n, n_cid,
             lambda v: cli_run(v, ["--json", "--correlation-id", cid])),
        ]
        if args.table_events:
            te = args.table_events
            measurements.append(("cli_table", f"cli table (first {te}, no --json)", te, te,
                                 lambda v: cli_run(v, ["--to-seq", str(te)])))
        for v in variants:
            res[v] = {}
        for key, name, scanned, expect, run in measurements:
            runs: dict[str, list] = {v: [] for v in variants}
            for _ in range(args.repeat):
                for v in variants:  # alternate, so a change in background load hits the variants alike
                    runs[v].append(await run(v))
            for v in variants:
                if runs[v][0][0] != expect:
                    raise AssertionError(f"{name} [{v}]: printed {runs[v][0][0]}, expected {expect}")
                log(f"[{v}]")
                res[v][key] = summarize(name, runs[v], scanned)
        for v in variants:
            r = res[v]
            startup = r["cli_startup"]["seconds_median"]
            r["cli"]["events_per_s_excluding_startup"] = round(n / max(1e-9, r["cli"]["seconds_median"] - startup), 1)
            r["target_events_per_s"] = TARGET
            r["verdict"] = verdict(r["cli"]["events_per_s"], TARGET)
            log(f"[{v}] `levers9 events replay --json` over {n} events: {r['cli']['events_per_s']:,.0f} events/s "
                f"(whole command, median of {args.repeat}); target {TARGET:,.0f}: {r['verdict']}")
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement (median reported)")
    ap.add_argument("--table-events", type=int, default=10_000, help="events for the table output (0: skip)")
    ap.add_argument("--with-s3", action="store_true", help="also start SeaweedFS, as `levers9 up` does")
    ap.add_argument("--max-wait-quiet", type=float, default=30,
                    help="before measuring, wait up to this many seconds for other load on the machine to "
                         "drop below 0.3 cores (0: don't wait)")
    ap.add_argument("--variants", default="library",
                    help="library (the code as it is). The push-based reader once compared with it as a "
                         "prototype is in the library now, so it is the only variant")
    ap.add_argument("--name", help="results file name (bench/results/NAME.json); default bench_replay, "
                                   "or bench_replay_ab when a variant other than library is run")
    a = ap.parse_args()
    for v in a.variants.split(","):
        if v.strip() != "library":
            ap.error(f"unknown variant {v!r}")
    a.name = a.name or ("bench_replay" if a.variants == "library" else "bench_replay_ab")
    started = time.perf_counter()
    result = asyncio.run(main(a))
    result["wall_s"] = round(time.perf_counter() - started, 1)
    write_results(a.name, result)
