"""Soak: a stack under mixed traffic keeps a flat number of consumers on every stream, flat
connections, a flat RSS in every process and no container left on disk.

Starts the whole stack as a user does (`levers9 up` in a temporary home), deploys examples/hello.py
and bench/soak_app.py (an endpoint and a function), then, for --minutes, calls hello's endpoint every
0.5 s, the soak app's function over REST every 2 s, runs `levers9 status` every 5 s and deploys
soak_app.py again (a new version, so the next call starts a new container) every --deploy-every s.
After a warm-up it samples five times (start, 25 %, middle, 75 %, end):

  consumers    every JetStream stream's consumer count (stream info; reading it creates none), the
               heartbeat bucket KV_levers9_heartbeats included;
  connections  NATS clients (the server's /connz) and Postgres sessions (pg_stat_activity);
  RSS          the resident memory of every process of the home (services, workers, servers, containers);
  disk         bytes per part of the home (the log, Postgres, S3, workers, logs), and the container
               directories on the node.

It prints them as tables and fails (exit 1) when a stream has more consumers at the end than at the
start, a connection count grew from start to end and over the second half, the container
directories grew by more than 3, or a process's RSS grew from start to end by more than the
tolerance: --rss-tolerance-pct of its start RSS or --rss-tolerance-mib, whichever is larger (Python
heaps settle in steps; a leak keeps growing), and it also grew over the second half of the run.
Postgres's processes are judged on their RSS less shared pages: their RSS grows as they touch the
shared buffer pool (up to shared_buffers). Disk is reported, not judged: the event log and the
projections grow with the traffic by design.

  python bench/soak.py --minutes 60 [--warmup 30] [--deploy-every 120] [--keep-home]

LEVERS9_BRIDGE_NAME / LEVERS9_BRIDGE_SUBNET / LEVERS9_CACHE_PORT choose the containers' bridge and the
node cache's port (to run beside another stack: a worker refuses another home's node cache).

tests/e2e/test_soak.py runs the same thing for a minute in CI (the consumer part only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats
import psutil
from soak_probes import connections, container_dirs, disk

ROOT = Path(__file__).resolve().parent.parent
HELLO = ROOT / "examples" / "hello.py"
SOAK_APP = Path(__file__).resolve().parent / "soak_app.py"
MIB = 1024 * 1024
SUBJECTS = "subjects in LEVERS9"  # not a stream: the log's distinct subjects, sampled with the consumers
# nats-server keeps a per-subject index of every stream in memory: about 290 bytes per distinct subject
# (bench/nats_subject_memory.py). Every container, call and deployment adds subjects of its own
# (levers9.<ws>.<aggregate>.<id>.<Type>), so the server's RSS follows the log's subject count as its
# disk follows the log's size; the verdict allows that much (400 bytes per new subject) and judges the rest.
SUBJECT_BYTES = 400
NOISE = 1 * MIB  # RSS moves by pages and allocator arenas: a second half within this has not grown


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- what is measured ------------------------------------------------------------------------------

async def _consumers(nats_url: str, home: Path | None = None) -> dict[str, int]:
    from levers9.runtime.bus_auth import BusAuth  # the home's admin: `levers9 up` runs NATS with auth
    from levers9.runtime.config import Settings

    auth = BusAuth.from_settings(Settings.load(env={"LEVERS9_HOME": str(home)})) if home else BusAuth()
    nc = await nats.connect(nats_url, name="levers9-soak", **auth.connect_options())
    try:
        counts = {info.config.name: info.state.consumer_count for info in await nc.jetstream().streams_info()}
        # nats.py's StreamState drops num_subjects: ask the API for the log's raw info
        raw = json.loads((await nc.request("$JS.API.STREAM.INFO.LEVERS9", b"", timeout=5)).data)
        counts[SUBJECTS] = int(raw.get("state", {}).get("num_subjects", 0))
        return counts
    finally:
        await nc.close()


def consumers(nats_url: str, home: Path | None = None) -> dict[str, int]:
    """Consumers per stream, from the streams' info (one request; it creates no consumer), and the
    number of distinct subjects in the log (under SUBJECTS)."""
    return asyncio.run(_consumers(nats_url, home))


def processes(home: Path, containers: frozenset[str] | set[str] = frozenset()) -> dict[str, psutil.Process]:
    """Every live process of `home`, by a label that says what it is (and its pid): those that name the
    home (services, workers, servers), what they started (postgres backends), and the processes of
    `containers` (the container ids of this home: each container is the cgroup levers9/<id>)."""
    out = {}
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            if (_of_home(proc, home) or any(_of_home(p, home) for p in proc.parents())
                    or _container_of(proc.pid) in containers):
                out[f"{label(proc)} [{proc.pid}]"] = proc
        except psutil.Error:
            continue
    return out


def _of_home(proc: psutil.Process, home: Path) -> bool:
    try:
        return str(home) in " ".join(proc.cmdline()) or proc.environ().get("LEVERS9_HOME") == str(home)
    except psutil.Error:
        return False


def _container_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            paths = [line.rsplit(":", 1)[-1].strip() for line in f]
    except OSError:
        return ""
    return next((p.split("/levers9/", 1)[1] for p in paths if "/levers9/" in p), "")


def label(proc: psutil.Process) -> str:
    name, cmd = proc.name(), proc.cmdline()
    with contextlib.suppress(psutil.Error):
        env = proc.environ()
        if env.get("LEVERS9_SERVICE") == "worker":
            return f"worker {env.get('LEVERS9_WORKER_ID', '')}".strip()
        if env.get("LEVERS9_SERVICE"):
            return env["LEVERS9_SERVICE"]
    if "levers9.runner" in cmd:
        return "container runner"
    if name == "postgres" and cmd and cmd[0].startswith("postgres:"):
        return "pg backend" if " levers9 " in cmd[0] else "pg " + cmd[0].split(":", 1)[1].strip()
    return {"nats-server": "nats", "weed": "s3 (weed)", "sh": "container sh"}.get(name, name)


def memory(home: Path, containers: frozenset[str] | set[str] = frozenset()) -> dict[str, tuple[int, int]]:
    """(RSS, of which shared pages) of every process of the home."""
    out = {}
    for key, proc in processes(home, containers).items():
        try:
            info = proc.memory_info()
            out[key] = (info.rss, getattr(info, "shared", 0))
        except psutil.Error:
            continue
    return out


@dataclass
class Sample:
    name: str
    at: float
    consumers: dict[str, int]
    mem: dict[str, tuple[int, int]]  # process -> (RSS, shared)
    connections: dict[str, int] = field(default_factory=dict)
    disk: dict[str, int] = field(default_factory=dict)  # part of the home -> bytes
    container_dirs: int = 0

    @property
    def rss(self) -> dict[str, int]:
        return {k: rss for k, (rss, _) in self.mem.items()}

    def judged(self, key: str) -> int:
        """The memory a verdict compares: RSS, less the shared pages for postgres's processes (their
        RSS grows as they touch the shared buffer pool, up to shared_buffers, and that is no leak)."""
        rss, shared = self.mem[key]
        return rss - shared if key.startswith(("pg ", "postgres ")) else rss


@dataclass
class Traffic:
    """Calls every `every` s and `levers9 status` every `status_every` s, in threads, until stopped."""
    gateway_url: str
    token: str
    env: dict[str, str]
    every: float = 0.5
    status_every: float = 5.0
    function_every: float = 0.0  # 0: no function calls
    deploy_every: float = 0.0  # 0: no deploys
    calls: list[float] = field(default_factory=list)  # latencies, s
    functions: list[float] = field(default_factory=list)  # latencies of the function calls, s
    deploys: list[float] = field(default_factory=list)  # durations of `levers9 deploy`, s
    errors: list[str] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # exit codes of `levers9 status`
    unhealthy: list[str] = field(default_factory=list)  # what each failing `levers9 status` printed
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "Traffic":
        self.threads = [threading.Thread(target=self._call, daemon=True),
                        threading.Thread(target=self._status, daemon=True)]
        if self.function_every:
            self.threads.append(threading.Thread(target=self._function, daemon=True))
        if self.deploy_every:
            self.threads.append(threading.Thread(target=self._deploy, daemon=True))
        for t in self.threads:
            t.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def _call(self) -> None:
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {self.token}"}) as http:
            while not self.stop.wait(self.every):
                started = time.perf_counter()
                try:
                    r = http.post(f"{self.gateway_url}/endpoint/hello", json={"name": "soak"})
                    if r.status_code == 200:
                        self.calls.append(time.perf_counter() - started)
                    else:
                        self.errors.append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")

    def _function(self) -> None:
        with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {self.token}"}) as http:
            n = 0
            while not self.stop.wait(self.function_every):
                n += 1
                started = time.perf_counter()
                try:
                    r = http.post(f"{self.gateway_url}/function/soak/add", json={"a": n, "b": 1})
                    if r.status_code == 200 and r.json().get("result") == n + 1:
                        self.functions.append(time.perf_counter() - started)
                    else:
                        self.errors.append(f"function: {r.status_code} {r.text[:200]}")
                except httpx.HTTPError as exc:
                    self.errors.append(f"function: {type(exc).__name__}: {exc}")

    def _deploy(self) -> None:
        while not self.stop.wait(self.deploy_every):
            started = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "levers9", "deploy", str(SOAK_APP)], env=self.env,
                               capture_output=True, text=True, timeout=300)
            if r.returncode == 0:
                self.deploys.append(time.perf_counter() - started)
            else:
                self.errors.append(f"deploy: {r.stderr[-300:]}")

    def _status(self) -> None:
        while not self.stop.wait(self.status_every):
            r = subprocess.run([sys.executable, "-m", "levers9", "status", "--json"], env=self.env,
                               capture_output=True, text=True, timeout=60)
            self.statuses.append(r.returncode)
            if r.returncode:
                self.unhealthy.append(r.stdout[-2000:] + r.stderr[-2000:])

    def summary(self) -> str:
        lat = sorted(self.calls)
        p = (lambda q: f"{lat[min(len(lat) - 1, int(q * len(lat)))] * 1000:.1f} ms") if lat else (lambda q: "-")
        fn = sorted(self.functions)
        q = (lambda x: f"{fn[min(len(fn) - 1, int(x * len(fn)))] * 1000:.1f} ms") if fn else (lambda x: "-")
        return (f"{len(lat)} endpoint calls ok (p50 {p(0.5)}, p99 {p(0.99)}), {len(fn)} function calls ok "
                f"(p50 {q(0.5)}, p99 {q(0.99)}), {len(self.deploys)} deploys ok, {len(self.errors)} failed; "
                f"{len(self.statuses)} `levers9 status` runs, {sum(1 for c in self.statuses if c)} unhealthy")


# ---- the stack -----------------------------------------------------------------------------------

class SoakStack:
    """`levers9 up` in `home`, examples/hello.py deployed and called once; `down` on exit."""

    def __init__(self, home: Path) -> None:
        self.home = home
        # a profile of its own; only the bridge may be chosen, so a soak can run beside another stack
        keep = ("LEVERS9_BRIDGE_NAME", "LEVERS9_BRIDGE_SUBNET", "LEVERS9_CACHE_PORT")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_") or k in keep}
        self.env["LEVERS9_HOME"] = str(home)
        self.gateway_url = self.token = self.nats_url = ""

    def cli(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "levers9", *args], env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"levers9 {' '.join(args)} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def __enter__(self) -> "SoakStack":
        started = time.perf_counter()
        try:
            self.cli("up", timeout=600)
            profile = tomllib.loads((self.home / "config.toml").read_text())
            self.gateway_url, self.token = profile["gateway_url"], profile["token"]
            self.nats_url = json.loads((self.home / "state.json").read_text())["nats_url"]
            self._wait_worker()
            self.cli("deploy", str(HELLO))
            first = self.call()
            if first.status_code != 200:
                raise RuntimeError(f"the first call failed: {first.status_code} {first.text}")
        except BaseException:
            self.__exit__()
            raise
        log(f"stack up, hello deployed and answering in {time.perf_counter() - started:.1f} s (home {self.home})")
        return self

    def __exit__(self, *exc: object) -> None:
        r = self.cli("down", timeout=300, check=False)
        if r.returncode != 0:
            log(f"levers9 down exited {r.returncode}: {r.stderr[-2000:]}")

    def call(self) -> httpx.Response:
        return httpx.post(f"{self.gateway_url}/endpoint/hello", json={"name": "soak"}, timeout=300,
                          headers={"Authorization": f"Bearer {self.token}"})

    def _wait_worker(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = httpx.get(f"{self.gateway_url}/api/v1/workers", headers={"Authorization": f"Bearer {self.token}"})
            if r.status_code == 200 and any(w["status"] == "ready" for w in r.json()):
                return
            time.sleep(0.5)
        raise RuntimeError(f"no worker became ready within {timeout:.0f} s")

    def traffic(self, mixed: bool = False, deploy_every: float = 120.0) -> Traffic:
        """Endpoint calls and `levers9 status`; mixed: also function calls and deploys (soak_app.py)."""
        if mixed:
            self.cli("deploy", str(SOAK_APP))
            return Traffic(self.gateway_url, self.token, self.env, function_every=2.0,
                           deploy_every=deploy_every).start()
        return Traffic(self.gateway_url, self.token, self.env).start()

    def containers(self) -> set[str]:
        r = httpx.get(f"{self.gateway_url}/api/v1/containers", headers={"Authorization": f"Bearer {self.token}"})
        r.raise_for_status()
        return {c["container_id"] for c in r.json()}

    def sample(self, name: str) -> Sample:
        return Sample(name, time.monotonic(), consumers(self.nats_url, self.home), memory(self.home, self.containers()),
                      connections(self.home), disk(self.home), container_dirs(self.home))


# ---- the verdict -----------------------------------------------------------------------------------

def consumer_problems(first: Sample, last: Sample) -> list[str]:
    return [f"stream {s}: {first.consumers.get(s, 0)} consumers at the start, {n} at the end"
            for s, n in sorted(last.consumers.items()) if s != SUBJECTS and n > first.consumers.get(s, 0)]


def subject_bytes(key: str, first: Sample, sample: Sample) -> int:
    """What the log's new subjects explain of nats-server's growth by `sample` (0 for other processes)."""
    if not key.startswith("nats "):
        return 0
    return SUBJECT_BYTES * max(0, sample.consumers.get(SUBJECTS, 0) - first.consumers.get(SUBJECTS, 0))


def rss_problems(samples: list[Sample], pct: float, mib: float) -> list[str]:
    """A process grew past the tolerance from start to end and still grew (beyond noise) over the
    second half; nats-server's growth is judged less what the log's new subjects explain."""
    first, middle, last = samples[0], samples[len(samples) // 2], samples[-1]
    out = []
    for key in sorted(set(first.mem) & set(last.mem)):
        explained = subject_bytes(key, first, last)
        start, end = first.judged(key), last.judged(key) - explained
        grew, allowed = end - start, max(start * pct / 100, mib * MIB)
        mid = middle.judged(key) - subject_bytes(key, first, middle) if key in middle.mem else None
        if grew > allowed and (mid is None or end > mid + NOISE):
            what = "RSS" if start == first.rss[key] else "RSS less shared pages"
            less = f", less {explained / MIB:.1f} MiB for the log's new subjects" if explained else ""
            out.append(f"{key}: {what} {start / MIB:.1f} -> {last.judged(key) / MIB:.1f} MiB "
                       f"(+{grew / MIB:.1f}{less}; allowed +{allowed / MIB:.1f})")
    return out


def connection_problems(samples: list[Sample]) -> list[str]:
    first, middle, last = samples[0], samples[len(samples) // 2], samples[-1]
    out = [f"{k}: {first.connections[k]} at the start, {middle.connections.get(k)} in the middle, {n} at the end"
           for k, n in sorted(last.connections.items())
           if n > first.connections.get(k, 0) and n > middle.connections.get(k, 0)]
    if last.container_dirs > first.container_dirs + 3:
        out.append(f"container directories on the node: {first.container_dirs} -> {last.container_dirs}")
    return out


def _rows(title: str, names: list[str], rows: dict[str, list[str]]) -> list[str]:
    lines = ["", title, "  " + f"{'':34}" + "".join(f"{n:>10}" for n in names)]
    return lines + ["  " + f"{key[:34]:34}" + "".join(f"{c:>10}" for c in cells) for key, cells in rows.items()]


def table(samples: list[Sample]) -> str:
    names = [s.name for s in samples]
    streams = sorted(set().union(*(s.consumers for s in samples)))
    lines = _rows("consumers per stream", names, {k: [str(s.consumers.get(k, "-")) for s in samples]
                                                  for k in streams})
    lines += _rows("connections", names, {k: [str(s.connections.get(k, "-")) for s in samples]
                                          for k in sorted(set().union(*(s.connections for s in samples)))})
    lines += _rows("RSS per process (MiB)", names, {k: [f"{s.rss[k] / MIB:.1f}" if k in s.rss else "-"
                                                        for s in samples]
                                                    for k in sorted(set().union(*(s.rss for s in samples)))})
    disk_rows = {k: [f"{s.disk[k] / MIB:.1f}" if k in s.disk else "-" for s in samples]
                 for k in sorted(set().union(*(s.disk for s in samples)))}
    disk_rows["container dirs (count)"] = [str(s.container_dirs) for s in samples]
    lines += _rows("disk (MiB)", names, disk_rows)
    return "\n".join(lines[1:])


def soak(minutes: float, warmup: float, pct: float, mib: float, home: Path, deploy_every: float) -> int:
    with SoakStack(home) as stack:
        traffic = stack.traffic(mixed=True, deploy_every=deploy_every)
        try:
            time.sleep(warmup)  # a bench paces itself: the traffic runs meanwhile
            samples = [stack.sample("start")]
            for name in ("25 %", "middle", "75 %", "end"):
                time.sleep(minutes * 15)
                samples.append(stack.sample(name))
                log(f"sampled {name}: {traffic.summary()}")
        finally:
            traffic.finish()
    print(table(samples))
    grown = {k: (samples[-1].disk.get(k, 0) - samples[0].disk.get(k, 0)) / MIB for k in samples[-1].disk}
    print(f"\ndisk growth over {minutes:g} min: " + ", ".join(f"{k} {v:+.1f} MiB" for k, v in grown.items()))
    print(f"traffic over {minutes:g} min (+{warmup:g} s warm-up): {traffic.summary()}")
    problems = consumer_problems(samples[0], samples[-1]) + connection_problems(samples) + \
        rss_problems(samples, pct, mib)
    done = len(traffic.calls) + len(traffic.functions) + len(traffic.deploys)
    if len(traffic.errors) > max(1, done // 100):
        problems.append(f"{len(traffic.errors)} calls failed, e.g. {traffic.errors[:3]}")
    for p in problems:
        print(f"FAIL {p}")
    if not problems:
        print(f"OK: consumers and connections flat; no RSS grew by more than {pct:g} % or {mib:g} MiB")
    return 1 if problems else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=30.0, help="seconds of traffic before the first sample")
    ap.add_argument("--deploy-every", type=float, default=120.0, help="seconds between deploys of soak_app.py")
    ap.add_argument("--rss-tolerance-pct", type=float, default=10.0)
    ap.add_argument("--rss-tolerance-mib", type=float, default=8.0)
    ap.add_argument("--keep-home", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="levers9-soak-"))
    os.chmod(tmp, 0o755)  # postgres runs as another account and must traverse it
    try:
        code = soak(args.minutes, args.warmup, args.rss_tolerance_pct, args.rss_tolerance_mib, tmp,
                    args.deploy_every)
    finally:
        if args.keep_home:
            log(f"home kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
