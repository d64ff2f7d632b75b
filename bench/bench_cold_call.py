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

Targets (issue 3): placement <= 10 ms; container start <= 250 ms on a cached image.

  python bench/bench_cold_call.py [--calls 12]

Also the launcher the other stack benchmark (bench_warm_calls.py) uses: `running_stack()`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
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


@app.endpoint(name="bench-cold", cpu=0.25, memory="128Mi", keep_warm_seconds=1, timeout=60)
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
def running_stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="levers9-bench-") as tmp:
        os.chmod(tmp, 0o755)  # services running as another account may need to traverse it
        stack = Stack(Path(tmp))
        try:
            stack.up()
            yield stack
        finally:
            stack.down()


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


def one_cold_call(stack: Stack, name: str) -> dict:
    stack.wait_no_live(name)
    time.sleep(0.2)  # the gateway's router learns of the stop in the same projection batch; margin
    sent = time.time()
    t0 = time.perf_counter()
    r = stack.http.post(f"/endpoint/{name}", json={})
    total_ms = (time.perf_counter() - t0) * 1000
    received = sent + total_ms / 1000
    if r.status_code != 200:
        raise RuntimeError(f"cold call answered {r.status_code}: {r.text[:500]}")
    cid = r.json()["container_id"]
    return {"container_id": cid, "sent": sent, "received": received, "total_ms": total_ms}


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


def worker_retries(stack: Stack, container_ids: list[str]) -> dict[str, int]:
    """How often the worker's placement handler was retried ("not projected yet": its reaction
    consumer ran before its own projection had the placement; each retry is a nak with >= 200 ms delay)."""
    text = (stack.home / "logs" / "worker.log").read_text(errors="replace")
    return {cid: text.count(f"container {cid} not projected yet") for cid in container_ids}


def table(rows: dict[str, dict[str, float]]) -> str:
    lines = [f"{'phase':<12} {'p50 ms':>9} {'min ms':>9} {'max ms':>9}  target"]
    targets = {"placement": f"<= {TARGET_PLACEMENT_MS:.0f} ms", "worker": f"<= {TARGET_START_MS:.0f} ms (start)",
               "runc_start": f"<= {TARGET_START_MS:.0f} ms (start, runc only)"}
    for name in PHASES:
        s = rows.get(name)
        if s:
            lines.append(f"{name:<12} {s['p50_ms']:>9.1f} {s['min_ms']:>9.1f} {s['max_ms']:>9.1f}  {targets.get(name, '')}")
    return "\n".join(lines)


def summarize(values: list[float]) -> dict[str, float]:
    s = percentiles(values)
    return {"n": s["n"], "p50_ms": s["p50_ms"], "min_ms": round(min(values), 3), "max_ms": s["max_ms"],
            "mean_ms": s["mean_ms"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=12, help="measured cold calls (after one that fills caches)")
    args = ap.parse_args()
    name = "bench-cold"
    load_before = os.getloadavg()
    with running_stack() as stack:
        stack.deploy(COLD_APP, "bench_cold")
        calls = []
        for i in range(args.calls + 1):
            call = one_cold_call(stack, name)
            call["events"] = stack.container_events(call["container_id"])
            calls.append(call)
            log(f"call {i}{' (first: fills the code cache, not counted)' if i == 0 else ''}: "
                f"{call['total_ms']:.0f} ms, container {call['container_id']}")
        stack.wait_no_live(name)  # the last one's log moves to <worker>/logs when it stops
        time.sleep(0.5)
        logs = stack.worker_dir() / "logs"
        retries = worker_retries(stack, [c["container_id"] for c in calls])
        for c in calls:
            c["phases"] = phases(c, c.pop("events"), birth_time(logs / f"{c['container_id']}.log"))
            c["worker_retries"] = retries[c["container_id"]]
    load_after = os.getloadavg()

    first, measured = calls[0], calls[1:]
    stats = {p: summarize([c["phases"][p] for c in measured]) for p in PHASES if p in measured[0]["phases"]}
    print(f"\ncold call, {len(measured)} calls (p50 / min / max), one worker, runc, cached base root fs:")
    print(table(stats))
    print(f"\nfirst call (code not yet cached on the worker): " +
          ", ".join(f"{k} {v:.0f}" for k, v in first["phases"].items()) + " ms")
    retried = sum(1 for c in measured if c["worker_retries"])
    print(f"worker retried its placement handler ('not projected yet', nak >= 200 ms) in {retried} of "
          f"{len(measured)} calls")
    placement, start = stats["placement"]["p50_ms"], stats["worker"]["p50_ms"]
    runc = stats.get("runc_start", {}).get("p50_ms")
    print(f"placement p50 {placement:.1f} ms (target <= {TARGET_PLACEMENT_MS:.0f}): "
          f"{verdict(placement, TARGET_PLACEMENT_MS, higher_is_better=False)}")
    print(f"container start p50 (Scheduled->Started) {start:.1f} ms (target <= {TARGET_START_MS:.0f}): "
          f"{verdict(start, TARGET_START_MS, higher_is_better=False)}"
          + (f"; of which runc start {runc:.1f} ms" if runc is not None else ""))
    write_results("cold_call", {
        "calls": len(measured), "app": "bench-cold: cpu 0.25, 128Mi, keep_warm_seconds=1, no on_start",
        "stack": "levers9 up on this machine: one local worker (min_warm=1, max_workers=1), runc runtime",
        "loadavg_before": load_before, "loadavg_after": load_after,
        "phases": stats, "first_call": first,
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
