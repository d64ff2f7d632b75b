"""Benchmark: one cold endpoint call, end to end, split into phases by the event log.

Starts the whole stack (`levers9 up` in a temporary home: NATS, Postgres, S3, the six services, one
local worker with the runc runtime), deploys a small app with keep_warm_seconds=1, makes one call
first (it fills the worker's code cache: reported apart, not in the figures), then --calls times:
wait until no container of the app is live (scaled to zero), make one call, and split its latency
with the `occurred_at` of the events of the container that served it
(`levers9 events replay --json --aggregate container --aggregate-id ID`):

  gateway      request sent            -> ContainerRequested  (auth, resolve, router, publish)
  placement    ContainerRequested      -> ContainerScheduled  (scheduler: consume, place, append)
  worker       ContainerScheduled      -> ContainerStarted    (worker: pick up, code, runc start)
    pickup       ContainerScheduled    -> runtime.start begins (see below)
    runc_start   runtime.start begins  -> ContainerStarted    (overlay, netns/veth, `runc run`)
  ready        ContainerStarted        -> ContainerReady      (runner import + on_start + health poll)
  proxy        ContainerReady          -> response received   (gateway sees Ready, proxies, answers)

"runtime.start begins" is the birth time (statx) of the container's log file: the runc runtime
writes it into the container's upper layer first thing, and keeps it (renamed, so the birth time
stays) in <worker>/logs/ after the container stops. Everything runs on this machine, so the client's
clock and the services' clocks are the same clock.

Two diagnostics explain the phases further:
  hand-offs  a core NATS subscription to `>` (the tap) sees each event delivered to each consumer
             and that consumer's ack or nak: how long the scheduler's projection took before it
             placed, whether the worker nak-ed its placement ("not projected yet": its reaction ran
             before its own projection; redelivery comes >= 200 ms later), when the gateway's
             projection took ContainerReady in.
  ARP        the host's ARP entry (`ip -j neigh`) for the address the new container gets, taken just
             before the call: addresses are reused (lowest free) with a new random MAC, so a still
             REACHABLE entry sends the worker's health polls to a dead MAC until it expires (up to
             ~45 s). --flush-neigh flushes the bridge's entries before each call, to show the difference.

Targets (issue 3): placement <= 10 ms; container start <= 250 ms on a cached image.

  python bench/bench_cold_call.py [--calls 12] [--flush-neigh] [--keep-home]

Also the launcher the other stack benchmark (bench_warm_calls.py) uses: `running_stack()`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
from pathlib import Path
from typing import Iterator

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import log, percentiles, verdict, write_results  # noqa: E402

PY = sys.executable
POOLS = '[pools.default]\nbackend = "local"\nmin_warm = 1\nmax_workers = 1\n'
TARGET_PLACEMENT_MS = 10.0
TARGET_START_MS = 250.0
PHASES = ("gateway", "placement", "worker", "pickup", "runc_start", "ready", "proxy", "total")

COLD_APP = '''
import os
from levers9 import App

app = App("bench-cold")


@app.endpoint(name="bench-cold", cpu=CPU, memory="128Mi", keep_warm_seconds=1, timeout=60)
def bench_cold():
    return {"container_id": os.environ.get("LEVERS9_CONTAINER_ID", "")}
'''


class Stack:
    """A levers9 stack started with `levers9 up` in a temporary home (one worker: min_warm=1,
    max_workers=1), stopped with `levers9 down` when the `with` block ends, whatever happens."""

    def __init__(self, home: Path) -> None:
        self.home = home
        (home / "pools.toml").write_text(POOLS)
        self.env = {**os.environ, "LEVERS9_HOME": str(home), "LEVERS9_POOLS_FILE": str(home / "pools.toml")}
        self.gateway_url = self.token = ""
        self.http: httpx.Client | None = None

    def cli(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        r = subprocess.run([PY, "-m", "levers9", *args], env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"levers9 {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def up(self) -> None:
        started = time.perf_counter()
        self.cli("up", timeout=180)
        profile = tomllib.loads((self.home / "config.toml").read_text())
        self.gateway_url, self.token = profile["gateway_url"], profile["token"]
        self.http = httpx.Client(base_url=self.gateway_url, timeout=120,
                                 headers={"Authorization": f"Bearer {self.token}"})
        log(f"levers9 up in {time.perf_counter() - started:.1f} s; gateway {self.gateway_url}")

    def down(self) -> None:
        if self.http is not None:
            self.http.close()
        try:
            self.cli("down", timeout=120, check=False)
        except subprocess.TimeoutExpired:
            log("levers9 down timed out")

    def state(self) -> dict:
        return json.loads((self.home / "state.json").read_text())

    def pid(self, component: str) -> int:
        return int(self.state()["components"][component]["pid"])

    def deploy(self, source: str, module: str) -> None:
        app_dir = self.home / f"app-{module}"
        app_dir.mkdir()
        path = app_dir / f"{module}.py"
        path.write_text(textwrap.dedent(source))
        self.cli("deploy", str(path))

    def containers(self, name: str, all: bool = False) -> list[dict]:
        r = self.http.get("/api/v1/containers", params={"all": "true" if all else "false"})
        r.raise_for_status()
        return [c for c in r.json() if c.get("deployment_name") == name]

    def wait_no_live(self, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.containers(name):
            if time.monotonic() > deadline:
                raise RuntimeError(f"a container of {name} is still live after {timeout:.0f} s")
            time.sleep(0.05)

    def container_events(self, container_id: str) -> list[dict]:
        out = self.cli("events", "replay", "--json", "--aggregate", "container", "--aggregate-id", container_id)
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def worker_dir(self) -> Path:
        found = sorted((self.home / "workers").glob("*/logs"))
        if not found:
            raise RuntimeError(f"no worker state under {self.home / 'workers'}")
        return found[0].parent


@contextlib.contextmanager
def running_stack(keep_home: bool = False) -> Iterator[Stack]:
    """A stack in a new temporary home; with keep_home the home (logs, worker state) is left for
    reading afterwards and its path logged, else it is removed."""
    tmp = tempfile.mkdtemp(prefix="levers9-bench-")
    os.chmod(tmp, 0o755)  # services running as another account may need to traverse it
    stack = Stack(Path(tmp))
    try:
        stack.up()
        yield stack
    finally:
        stack.down()
        if keep_home:
            log(f"home kept: {tmp} (logs in {tmp}/logs)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


class Tap:
    """Every message on the NATS server, with the time this process received it (a core subscription to
    `>`): when each consumer was handed an event (a message whose reply subject is
    `$JS.ACK.<stream>.<consumer>....`) and when it acked it. The stack's traffic is small while calls
    are made one at a time, so this costs little; it runs in a thread of its own."""

    def __init__(self, nats_url: str, home: Path) -> None:
        import asyncio
        import threading
        self.url = nats_url
        self.home = home
        self.seen: list[tuple[float, str, str, bytes]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.nc = None

    def start(self) -> "Tap":
        import asyncio

        import nats
        self.thread.start()

        async def connect():
            from levers9.runtime.bus_auth import BusAuth
            from levers9.runtime.config import Settings

            # `levers9 up` runs NATS with auth: the tap reads as the home's admin, like the CLI
            auth = BusAuth.from_settings(Settings.load(env={"LEVERS9_HOME": str(self.home)}))
            self.nc = await nats.connect(self.url, name="levers9-bench-tap", **auth.connect_options())

            async def got(msg):
                self.seen.append((time.time(), msg.subject, msg.reply or "", bytes(msg.data[:2000])))
            await self.nc.subscribe(">", cb=got)
            await self.nc.flush()
        asyncio.run_coroutine_threadsafe(connect(), self.loop).result(10)
        return self

    def stop(self) -> None:
        import asyncio
        if self.nc is not None:
            asyncio.run_coroutine_threadsafe(self.nc.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def handed(self, container_id: str, event_type: str) -> dict[str, dict]:
        """{consumer: {"delivered": t, "answered": t, "deliveries": n, "naks": n, "done": t}} for that
        container's event: first delivery, first answer (ack, or nak), how often it was delivered and
        nak-ed, and the time of the final ack. Consumer names lose their per-process suffix."""
        needle, kind = container_id.encode(), f'"type":"{event_type}"'.encode()
        out: dict[str, dict] = {}
        replies: dict[str, str] = {}
        for t, subject, reply, data in self.seen:
            if reply.startswith("$JS.ACK.") and needle in data and kind in data:
                tokens = reply.split(".")
                consumer = re.sub(r"-\d+-\d+$", "", tokens[3] if len(tokens) < 12 else tokens[5])  # v1 / v2
                rec = out.setdefault(consumer, {"delivered": t, "deliveries": 0, "naks": 0})
                rec["deliveries"] += 1
                replies[reply] = consumer
            elif subject in replies:
                rec = out[replies.pop(subject)]
                rec.setdefault("answered", t)
                if data.startswith(b"-NAK"):
                    rec["naks"] += 1
                else:
                    rec["done"] = t
        return out

    def published(self, container_id: str, event_type: str) -> float | None:
        """When an event about the container was published (its first message on a stream subject)."""
        needle = container_id.encode()
        for t, subject, reply, data in self.seen:
            if subject.endswith(f".{event_type}") and not reply.startswith("$JS.ACK.") and needle in data:
                return t
        return None


def ts(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def birth_time(path: Path) -> float | None:
    """statx birth time of a file (GNU stat %W/%w), or None where the file system does not keep it."""
    r = subprocess.run(["stat", "-c", "%w", str(path)], capture_output=True, text=True)
    text = r.stdout.strip()
    if r.returncode != 0 or not text or text == "-":
        return None
    date, clock, zone = text.split()
    whole, _, frac = clock.partition(".")
    stamp = dt.datetime.fromisoformat(f"{date}T{whole}{zone[:3]}:{zone[3:]}").timestamp()
    return stamp + float(f"0.{frac or 0}")


BRIDGE = os.environ.get("LEVERS9_BRIDGE_NAME", "levers9br0")


def neighbours() -> dict[str, dict]:
    """The host's ARP entries on the containers' bridge: {ip: {"state": [...], "lladdr": mac}}."""
    r = subprocess.run(["ip", "-j", "neigh", "show", "dev", BRIDGE], capture_output=True, text=True)
    try:
        return {n["dst"]: {"state": n.get("state", []), "lladdr": n.get("lladdr", "")} for n in json.loads(r.stdout)}
    except ValueError:
        return {}


def one_cold_call(stack: Stack, name: str, flush_neigh: bool = False) -> dict:
    stack.wait_no_live(name)
    time.sleep(0.2)  # the gateway's router learns of the stop in the same projection batch; margin
    if flush_neigh:  # diagnostic: forget the host's ARP entries of stopped containers' (reused) addresses
        subprocess.run(["ip", "neigh", "flush", "dev", BRIDGE], capture_output=True)
    arp = neighbours()
    sent = time.time()
    t0 = time.perf_counter()
    r = stack.http.post(f"/endpoint/{name}", json={})
    total_ms = (time.perf_counter() - t0) * 1000
    received = sent + total_ms / 1000
    if r.status_code != 200:
        raise RuntimeError(f"cold call answered {r.status_code}: {r.text[:500]}")
    cid = r.json()["container_id"]
    return {"container_id": cid, "sent": sent, "received": received, "total_ms": total_ms, "arp_before": arp}


def handoffs(tap: Tap, call: dict, events: list[dict]) -> dict[str, float]:
    """Where the time between the events goes, from the tap, as ms after the event's occurred_at: its
    delivery to each consumer that acts on it, that consumer's first answer (ack or nak) and final ack;
    plus the scheduler's WorkerSlotReserved (appended before ContainerScheduled) after ContainerRequested."""
    at = {e["type"]: ts(e["occurred_at"]) for e in reversed(events)}
    cid, out = call["container_id"], {}
    ms = lambda t, t0: round((t - t0) * 1000, 3)  # noqa: E731
    for event_type, who in (("ContainerRequested", "scheduler"), ("ContainerScheduled", "worker"),
                            ("ContainerReady", "gateway")):
        if event_type not in at:
            continue
        for consumer, rec in tap.handed(cid, event_type).items():
            if consumer.startswith(who):
                key = f"{event_type} -> {consumer}"
                out[f"{key}: delivered"] = ms(rec["delivered"], at[event_type])
                if "answered" in rec:
                    out[f"{key}: first answer"] = ms(rec["answered"], at[event_type])
                if rec["naks"] and "done" in rec:
                    out[f"{key}: acked after {rec['naks']} nak"] = ms(rec["done"], at[event_type])
    reserved = tap.published(cid, "WorkerSlotReserved")
    if reserved is not None and "ContainerRequested" in at:
        out["ContainerRequested -> WorkerSlotReserved published"] = ms(reserved, at["ContainerRequested"])
    return out


def phases(call: dict, events: list[dict], runc_begins: float | None) -> dict:
    at = {}
    for e in events:
        at.setdefault(e["type"], ts(e["occurred_at"]))  # the first of each (a retry would repeat some)
    need = ("ContainerRequested", "ContainerScheduled", "ContainerStarted", "ContainerReady")
    missing = [t for t in need if t not in at]
    if missing:
        raise RuntimeError(f"container {call['container_id']} has no {missing} (events: {[e['type'] for e in events]})")
    ms = lambda a, b: round((b - a) * 1000, 3)  # noqa: E731
    out = {"gateway": ms(call["sent"], at["ContainerRequested"]),
           "placement": ms(at["ContainerRequested"], at["ContainerScheduled"]),
           "worker": ms(at["ContainerScheduled"], at["ContainerStarted"]),
           "ready": ms(at["ContainerStarted"], at["ContainerReady"]),
           "proxy": ms(at["ContainerReady"], call["received"]),
           "total": round(call["total_ms"], 3)}
    if runc_begins is not None:
        out["pickup"] = ms(at["ContainerScheduled"], runc_begins)
        out["runc_start"] = ms(runc_begins, at["ContainerStarted"])
    return out


def table(rows: dict[str, dict[str, float]]) -> str:
    lines = [f"{'phase':<12} {'p50 ms':>9} {'min ms':>9} {'max ms':>9}  target"]
    targets = {"placement": f"<= {TARGET_PLACEMENT_MS:.0f} ms", "worker": f"<= {TARGET_START_MS:.0f} ms (start)",
               "runc_start": f"<= {TARGET_START_MS:.0f} ms (start, runc only)"}
    for name in PHASES:
        s = rows.get(name)
        if s:
            lines.append(f"{name:<12} {s['p50_ms']:>9.1f} {s['min_ms']:>9.1f} {s['max_ms']:>9.1f}  "
                         f"{targets.get(name, '')}")
    return "\n".join(lines)


def summarize(values: list[float]) -> dict[str, float]:
    s = percentiles(values)
    return {"n": s["n"], "p50_ms": s["p50_ms"], "min_ms": round(min(values), 3), "max_ms": s["max_ms"],
            "mean_ms": s["mean_ms"]}


def set_async_commit(dsn: str) -> None:
    """synchronous_commit=off for the whole (temporary) server of this run: a commit returns before its
    WAL is flushed to disk. Diagnostic only: it shows how much of each hand-off is the fsync."""
    import asyncio

    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("ALTER SYSTEM SET synchronous_commit = off")
            await conn.execute("SELECT pg_reload_conf()")
        finally:
            await conn.close()
    asyncio.run(run())
    log("Postgres of this run: synchronous_commit = off (diagnostic)")


def stale(entry: dict | None) -> bool:
    """The host still had a live ARP entry (another container's MAC) for the address the new container got."""
    live = {"REACHABLE", "STALE", "DELAY", "PROBE"}
    return bool(entry and entry.get("lladdr") and set(entry.get("state", [])) & live)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=12, help="measured cold calls (after one that fills caches)")
    ap.add_argument("--flush-neigh", action="store_true",
                    help="diagnostic: flush the host's ARP cache on the bridge before each call")
    ap.add_argument("--cpu", type=float, default=0.25,
                    help="the app's cpu (cores: its cgroup CPU quota; the runner's start-up runs under it)")
    ap.add_argument("--async-commit", action="store_true",
                    help="diagnostic: synchronous_commit=off on this run's Postgres (projection commits "
                         "stop waiting for the WAL flush)")
    ap.add_argument("--budget-s", type=float, default=170.0,
                    help="start no new call after this many seconds (stalled calls can take ~45 s each)")
    ap.add_argument("--keep-home", action="store_true", help="leave the stack's home (logs) for reading")
    args = ap.parse_args()
    name = "bench-cold"
    load_before = os.getloadavg()
    with running_stack(args.keep_home) as stack:
        if args.async_commit:
            set_async_commit(stack.state()["database_url"])
        tap = Tap(stack.state()["nats_url"], stack.home).start()
        try:
            stack.deploy(COLD_APP.replace("CPU", repr(args.cpu)), "bench_cold")
            calls = []
            began = time.monotonic()
            for i in range(args.calls + 1):
                if i > 1 and time.monotonic() - began > args.budget_s:
                    log(f"time budget of {args.budget_s:.0f} s spent: stopping after {i - 1} measured calls")
                    break
                call = one_cold_call(stack, name, args.flush_neigh)
                call["events"] = stack.container_events(call["container_id"])
                call["address"] = next((e["data"]["address"] for e in call["events"]
                                        if e["type"] == "ContainerReady"), "")
                ip = call["address"].split("//")[-1].split(":")[0]
                call["arp_entry_before"] = call.pop("arp_before").get(ip)
                calls.append(call)
                log(f"call {i}{' (first: fills the code cache, not counted)' if i == 0 else ''}: "
                    f"{call['total_ms']:.0f} ms, container {call['container_id']} at {call['address']}, "
                    f"host ARP entry for that address before the call: {call['arp_entry_before']}")
            stack.wait_no_live(name)  # the last one's log moves to <worker>/logs when it stops
            time.sleep(0.5)
        finally:
            tap.stop()
        logs = stack.worker_dir() / "logs"
        for c in calls:
            c["handoffs_ms"] = handoffs(tap, c, c["events"])
            c["phases"] = phases(c, c.pop("events"), birth_time(logs / f"{c['container_id']}.log"))
            # the worker's placement handler ran before its own projection had the placement ("not
            # projected yet"): it nak-ed, and JetStream redelivered after the nak delay (>= 200 ms)
            c["worker_naks"] = sum(r["naks"] for k, r in tap.handed(c["container_id"], "ContainerScheduled").items()
                                   if k.startswith("worker"))
            c["stale_arp"] = stale(c["arp_entry_before"])
    load_after = os.getloadavg()

    first, measured = calls[0], calls[1:]
    stats = {p: summarize([c["phases"][p] for c in measured]) for p in PHASES if p in measured[0]["phases"]}
    print(f"\ncold call, {len(measured)} calls (p50 / min / max), one worker, runc, cached base root fs:")
    print(table(stats))
    print("\nfirst call (code not yet cached on the worker): " +
          ", ".join(f"{k} {v:.0f}" for k, v in first["phases"].items()) + " ms")
    keys = sorted({k for c in measured for k in c["handoffs_ms"]})
    handoff_stats = {k: summarize([c["handoffs_ms"][k] for c in measured if k in c["handoffs_ms"]]) for k in keys}
    print("\nhand-offs (from the event's occurred_at to its delivery to / ack by the consumer), p50 / min / max ms:")
    for k, v in handoff_stats.items():
        print(f"  {k:<52} {v['p50_ms']:>8.1f} {v['min_ms']:>8.1f} {v['max_ms']:>8.1f}")
    retried = sum(1 for c in measured if c["worker_naks"])
    print(f"worker nak-ed its placement ('not projected yet', redelivered >= 200 ms later) in {retried} of "
          f"{len(measured)} calls")
    with_stale = [c["phases"]["ready"] for c in measured if c["stale_arp"]]
    without = [c["phases"]["ready"] for c in measured if not c["stale_arp"]]
    arp = {"calls_with_stale_entry": len(with_stale), "of": len(measured),
           "ready_with_stale_entry": summarize(with_stale) if with_stale else None,
           "ready_without": summarize(without) if without else None}
    print(f"ready phase when the host had an ARP entry (old MAC) for the reused address: "
          f"{arp['ready_with_stale_entry']} ({len(with_stale)} calls); without: {arp['ready_without']}")
    placement, start = stats["placement"]["p50_ms"], stats["worker"]["p50_ms"]
    runc = stats.get("runc_start", {}).get("p50_ms")
    print(f"placement p50 {placement:.1f} ms (target <= {TARGET_PLACEMENT_MS:.0f}): "
          f"{verdict(placement, TARGET_PLACEMENT_MS, higher_is_better=False)}")
    print(f"container start p50 (Scheduled->Started) {start:.1f} ms (target <= {TARGET_START_MS:.0f}): "
          f"{verdict(start, TARGET_START_MS, higher_is_better=False)}"
          + (f"; of which runc start {runc:.1f} ms" if runc is not None else ""))
    # the figures of the system as it is go to cold_call.json; those of a diagnostic run apart
    write_results("cold_call" + ("_arp_flushed" if args.flush_neigh else "")
                  + ("_async_commit" if args.async_commit else "")
                  + (f"_cpu{args.cpu:g}" if args.cpu != 0.25 else ""), {
        "calls": len(measured), "app": f"bench-cold: cpu {args.cpu:g}, 128Mi, keep_warm_seconds=1, no on_start",
        "stack": "levers9 up on this machine: one local worker (min_warm=1, max_workers=1), runc runtime",
        "flush_neigh": args.flush_neigh, "async_commit": args.async_commit,
        "loadavg_before": load_before, "loadavg_after": load_after,
        "phases": stats, "handoffs": handoff_stats, "stale_arp": arp, "first_call": first,
        "targets": {"placement_p50_ms": TARGET_PLACEMENT_MS, "container_start_p50_ms": TARGET_START_MS},
        "verdicts": {"placement": verdict(placement, TARGET_PLACEMENT_MS, higher_is_better=False),
                     "container_start": verdict(start, TARGET_START_MS, higher_is_better=False),
                     "container_start_runc_only": None if runc is None
                     else verdict(runc, TARGET_START_MS, higher_is_better=False)},
        "worker_placement_retries": {"calls_with_retry": retried, "of": len(measured)},
        "runs": measured,
    })


if __name__ == "__main__":
    main()
