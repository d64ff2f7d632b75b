"""What the benchmarks share: real servers in a temporary home, a fast publisher, percentiles, results.

Every benchmark starts its own NATS and Postgres through `levers9.stack.Stack` (the same
launcher `levers9 up` uses), so the figures are against real local servers, never mocks. S3 is not
needed by the event backbone; it is started only with --with-s3, because SeaweedFS's background
work would otherwise compete for the two cores this machine has.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from nats.js.api import Header

from levers9.contracts import Envelope, encode, subjects

RESULTS = Path(__file__).resolve().parent / "results"

# Bus.close() drains, and nats-py reports the drain as a disconnect ("nats disconnected; reconnecting"):
# noise here. The benchmarks check counts and rows themselves.
import logging  # noqa: E402

logging.getLogger("levers9.bus").setLevel(logging.ERROR)


@contextlib.contextmanager
def servers(with_s3: bool = False) -> Iterator[tuple[dict[str, str], Path]]:
    """({"nats_url", "database_url", "s3_endpoint"}, home) of servers started for this run; always
    stopped, and the temporary home removed."""
    from levers9.runtime.config import Settings
    from levers9.stack import Stack

    with tempfile.TemporaryDirectory(prefix="levers9-bench-") as tmp:
        home = Path(tmp)
        env = {"LEVERS9_HOME": str(home)}
        if not with_s3:  # marked external: the launcher leaves it alone and nothing here uses it
            env["LEVERS9_S3_ENDPOINT"] = "http://127.0.0.1:9/unused-by-benchmarks"
        stack = Stack(home, Settings.load(env=env))
        try:
            started = time.perf_counter()
            urls = stack.start_servers()
            log(f"servers up in {time.perf_counter() - started:.1f} s: nats {urls['nats_url']}, "
                f"postgres {urls['database_url']}")
            yield urls, home
        finally:
            stack.down()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def headers_for(env: Envelope) -> dict[str, str]:
    # the same headers Bus.publish sends (minus trace context): dedup by envelope id, expected stream
    return {Header.MSG_ID: env.id, Header.EXPECTED_STREAM: subjects.STREAM}


async def publish_many(bus, envs: Sequence[Envelope], *, window: int = 2000) -> list[int]:
    """Publish without waiting for each ack: `js.publish_async` keeps up to `window` acks in flight.

    Every message carries `Nats-Msg-Id` = envelope id and `encode(env)` on `env.subject`, exactly
    like `Bus.publish`; every ack is checked (an error raises) and the stream sequences returned.
    """
    js = bus.nc.jetstream(publish_async_max_pending=window)
    futures = []
    for env in envs:
        futures.append(await js.publish_async(env.subject, encode(env), headers=headers_for(env)))
    acks = await asyncio.gather(*futures)
    dup = sum(1 for a in acks if a.duplicate)
    if dup:
        raise RuntimeError(f"{dup} publishes were reported as duplicates")
    return [a.seq for a in acks]


def percentiles(values_ms: Iterable[float]) -> dict[str, float]:
    xs = sorted(values_ms)
    if not xs:
        return {}

    def pct(p: float) -> float:
        k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
        return round(xs[k], 3)

    return {"n": len(xs), "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99), "p999_ms": pct(99.9),
            "max_ms": round(xs[-1], 3), "mean_ms": round(statistics.fmean(xs), 3)}


def machine() -> dict[str, object]:
    from levers9.stack import binary, pg_bin  # the binaries the launchers run

    def version(cmd: list[str]) -> str:
        import subprocess
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout.strip().splitlines()[0]
        except Exception as exc:  # noqa: BLE001 - informational only
            return f"unknown ({exc})"

    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "nats_server": version([binary("nats-server"), "--version"]),
            "postgres": version([pg_bin("postgres"), "--version"])}


def write_results(name: str, doc: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    doc = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": machine(), **doc}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    log(f"results written to {path}")
    return path


def verdict(value: float, target: float, higher_is_better: bool = True) -> str:
    ok = value >= target if higher_is_better else value <= target
    return "MET" if ok else "MISSED"


def cpu_seconds(pid: int) -> float:
    """Time on CPU of all threads of a process, from the scheduler's exact accounting: the tick-based
    user/system times of /proc/PID/stat miss most of a process that runs in short bursts (a Postgres
    backend answering one small query at a time showed ~0 there)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return total / 1e9


class CpuMeter:
    """CPU used by this process, the NATS server and Postgres (all its backends) over a span, as cores
    (1.0 = one core busy all the time): on a 2-core machine it says which of them uses the cores.

    A thread samples every process every 0.2 s, so a process that exits meanwhile (asyncpg's pool
    replaces a connection after 50,000 queries: its backend exits) still counts up to its last sample.
    """

    def __init__(self, home: Path, extra_pids: Sequence[int] = (), every: float = 0.2) -> None:
        import psutil
        self._psutil = psutil
        self.home = home
        self.extra_pids = list(extra_pids)
        self.every = every
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._owner: dict[int, str] = {}
        self._done = None
        self._thread = None
        self._t0 = 0.0

    def _procs(self) -> dict[str, list[int]]:
        ps = self._psutil
        out: dict[str, list[int]] = {"bench_python": [os.getpid()]}
        for name in ("nats", "postgres"):
            try:
                root = ps.Process(int((self.home / "run" / f"{name}.pid").read_text().split()[0]))
                out[name] = [root.pid, *(c.pid for c in root.children(recursive=True))]
            except (OSError, ValueError, ps.Error):
                out[name] = []
        out["publisher"] = [p for p in self.extra_pids if ps.pid_exists(p)]
        return out

    def _sample(self, first: bool) -> None:
        for name, pids in self._procs().items():
            for pid in pids:
                value = cpu_seconds(pid)
                if value <= 0:
                    continue
                if pid not in self._first:
                    self._first[pid] = value if first else 0.0  # born during the span: all of it counts
                    self._owner[pid] = name
                self._last[pid] = value

    def _loop(self) -> None:
        while not self._done.wait(self.every):
            self._sample(False)

    @staticmethod
    def _machine_busy() -> float:
        """Busy CPU seconds of the whole machine (all cores), from /proc/stat."""
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
        idle = ticks[3] + ticks[4]  # idle + iowait
        return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")

    def start(self) -> "CpuMeter":
        import threading
        self._busy0 = self._machine_busy()
        self._sample(True)
        self._t0 = time.perf_counter()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._done.set()
        self._thread.join()
        self._sample(False)
        wall = max(1e-9, time.perf_counter() - self._t0)
        used: dict[str, float] = {"bench_python": 0.0, "nats": 0.0, "postgres": 0.0}
        if self.extra_pids:
            used["publisher"] = 0.0
        for pid, first in self._first.items():
            used[self._owner[pid]] = used.get(self._owner[pid], 0.0) + self._last[pid] - first
        busy = self._machine_busy() - self._busy0
        # what other processes on this machine (other people's tests, ...) took meanwhile
        used["everything_else"] = max(0.0, busy - sum(used.values()))
        return {name: round(v / wall, 2) for name, v in used.items()}


def machine_busy_cores(seconds: float = 1.0) -> float:
    """How many cores the whole machine kept busy over `seconds` (our servers idle meanwhile)."""
    a = CpuMeter._machine_busy()
    time.sleep(seconds)
    return (CpuMeter._machine_busy() - a) / seconds


def wait_quiet(max_wait: float = 60.0, threshold: float = 0.3) -> float:
    """This machine is shared (other people run tests on it): wait, up to max_wait seconds, until the
    rest of the machine uses less than `threshold` cores, so a phase is not measured in a burst of
    someone else's load. Returns the background load when the phase starts (recorded with results)."""
    deadline = time.monotonic() + max_wait
    while True:
        busy = machine_busy_cores(1.0)
        if busy < threshold or time.monotonic() > deadline:
            if busy >= threshold:
                log(f"the machine stays busy ({busy:.2f} cores used by others): measuring anyway")
            return round(busy, 2)
