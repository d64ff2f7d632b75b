"""Benchmark: warm calls through the gateway vs straight to the container, same run.

Starts the whole stack (`levers9 up` in a temporary home, one local worker with the runc runtime),
deploys a trivial endpoint with concurrency=100, max_containers=1, keep_warm_seconds=600, warms it
(one call through the gateway; its container's address comes from GET /api/v1/containers), then
for 1, 10 and 100 concurrent clients runs the same load twice, one after the other:

  direct    GET http://<container address>/              (the runner in the container)
  gateway   GET <gateway>/endpoint/bench-warm + token    (auth, resolve, route, proxy, runner)

with `wrk` (C, event loop; one thread: enough for a Python server on 2 cores) for --seconds each,
and reports requests/s and p50/p99 latency, the latency the gateway adds at p50, and the gateway's
throughput as % of direct. While each run goes, the CPU of the gateway, the runner, wrk and the rest
of the machine is sampled (cores busy; on 2 cores it says who saturates). With --profile, one more
gateway run at 100 clients is sampled with py-spy and the time is attributed to the functions of
services/gateway/*.py and to the libraries under them.

Targets (issue 3): p50 added by the gateway <= 2 ms; gateway >= 50% of direct throughput at 100 clients.

  apt-get install -y wrk; /tmp/venv/bin/pip install py-spy   # once
  python bench/bench_warm_calls.py [--seconds 5] [--profile]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CpuMeter, _cpu_seconds, log, verdict, write_results  # noqa: E402
from bench_cold_call import running_stack  # noqa: E402

CLIENTS = (1, 10, 100)
TARGET_ADDED_P50_MS = 2.0
TARGET_THROUGHPUT_PCT = 50.0

WARM_APP = '''
from levers9 import App

app = App("bench-warm")


@app.endpoint(name="bench-warm", cpu=1.0, memory="256Mi", concurrency=100, max_containers=1,
              keep_warm_seconds=600, timeout=60)
def bench_warm():
    return {"ok": True}
'''

# wrk prints this line last: what the run measured, as JSON (latency in microseconds)
REPORT_LUA = r'''
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "bytes": %d, "errors": {"connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d}, "latency_us": {"p50": %d, "p90": %d, "p99": %d, ' ..
    '"max": %d, "mean": %.1f}}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
'''


def runner_pids() -> list[int]:
    """The runner processes of the containers (python3 -m levers9.runner inside runc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"levers9.runner" in f.read():
                        out.append(int(entry))
            except OSError:
                pass
    return out


class Cpu:
    """Cores busy per process group over a span (sampled every 0.2 s, so short-lived pids still count)."""

    def __init__(self, groups: dict[str, callable]) -> None:
        self.groups = groups
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.owner: dict[int, str] = {}
        self.done = threading.Event()

    def _sample(self, first: bool) -> None:
        for name, pids in self.groups.items():
            for pid in pids():
                v = _cpu_seconds(pid)
                if v <= 0:
                    continue
                if pid not in self.first:
                    self.first[pid], self.owner[pid] = (v if first else 0.0), name
                self.last[pid] = v

    def __enter__(self) -> "Cpu":
        self.busy0 = CpuMeter._machine_busy()
        self._sample(True)
        self.t0 = time.perf_counter()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.done.wait(0.2):
            self._sample(False)

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        self._sample(False)
        wall = max(1e-9, time.perf_counter() - self.t0)
        used = {name: 0.0 for name in self.groups}
        for pid, v0 in self.first.items():
            used[self.owner[pid]] += self.last[pid] - v0
        busy = CpuMeter._machine_busy() - self.busy0
        used["everything_else"] = max(0.0, busy - sum(used.values()))
        self.cores = {k: round(v / wall, 2) for k, v in used.items()}


def wrk(url: str, clients: int, seconds: float, script: Path, headers: dict[str, str], cpu_groups: dict) -> dict:
    cmd = ["wrk", "-t1", f"-c{clients}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(script)]
    for k, v in headers.items():
        cmd += ["-H", f"{k}: {v}"]
    cmd.append(url)
    proc_box: list[subprocess.Popen] = []
    groups = {**cpu_groups, "wrk": lambda: [p.pid for p in proc_box]}
    with Cpu(groups) as cpu:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc_box.append(proc)
        out, err = proc.communicate(timeout=seconds + 60)
    line = next((ln for ln in out.splitlines() if ln.startswith("WRK_JSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {out}\n{err}")
    r = json.loads(line[len("WRK_JSON "):])
    secs = r["duration_us"] / 1e6
    errors = sum(r["errors"].values())
    return {"clients": clients, "requests": r["requests"], "seconds": round(secs, 2),
            "rps": round(r["requests"] / secs, 1), "errors": r["errors"], "ok_rps": round((r["requests"] - errors) / secs, 1),
            "p50_ms": r["latency_us"]["p50"] / 1000, "p90_ms": r["latency_us"]["p90"] / 1000,
            "p99_ms": r["latency_us"]["p99"] / 1000, "max_ms": r["latency_us"]["max"] / 1000,
            "mean_ms": round(r["latency_us"]["mean"] / 1000, 3), "cpu_cores": cpu.cores}


# ---- profile ------------------------------------------------------------------------------------

GATEWAY_FRAME = re.compile(r"^(\w+) \((?:.*/)?services/gateway/(\w+\.py)(?::\d+)?\)$")
BUCKETS = (  # the first match, looked for from the leaf of each stack up
    ("httpx/httpcore (proxy client)", ("/httpx/", "/httpcore/")),
    ("h11 (HTTP/1.1 parsing, server and client)", ("/h11/",)),
    ("uvicorn (server protocol)", ("/uvicorn/",)),
    ("starlette/fastapi (routing, dependencies, responses)", ("/starlette/", "/fastapi/")),
    ("pydantic", ("/pydantic/", "pydantic_core")),
    ("asyncpg (Postgres)", ("/asyncpg/",)),
    ("json / msgspec", ("/json/", "msgspec")),
    ("asyncio event loop, selectors, sockets", ("/asyncio/", "selectors.py", "socket.py", "ssl.py")),
    ("levers9 (gateway, runtime, contracts)", ("/services/", "/libs/", "levers9")),
)


def profile_gateway(pid: int, url: str, headers: dict[str, str], script: Path, seconds: float, out_dir: Path) -> dict:
    """py-spy samples the gateway (--idle off: only stacks on CPU) while wrk drives it at 100 clients."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    raw = out_dir / "gateway.pyspy.txt"
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250",
                             "--format", "raw", "--output", str(raw), "--nonblocking"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.5)
    load = wrk(url, 100, seconds, script, headers, {})
    spy_out, _ = proc.communicate(timeout=seconds + 60)
    if proc.returncode != 0 or not raw.exists():
        return {"error": f"py-spy failed ({proc.returncode}): {spy_out[-2000:]}"}
    total = 0
    inclusive: collections.Counter = collections.Counter()
    self_time: collections.Counter = collections.Counter()
    buckets: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        seen = set()
        for fr in frames:
            m = GATEWAY_FRAME.match(fr.strip())
            if m and (key := f"{m.group(2)}:{m.group(1)}") not in seen:
                seen.add(key)
                inclusive[key] += n
        leaf = frames[-1].strip()
        self_time[leaf] += n
        for name, needles in BUCKETS:
            if any(s in leaf for s in needles):
                buckets[name] += n
                break
        else:
            buckets["other: " + re.sub(r" \(.*", "", leaf)] += n
    pct = lambda n: round(100.0 * n / max(1, total), 1)  # noqa: E731
    return {"samples": total, "rate_hz": 250, "load": load,
            "gateway_functions_inclusive_pct": {k: pct(v) for k, v in inclusive.most_common(25)},
            "leaf_buckets_pct": {k: pct(v) for k, v in buckets.most_common(15)},
            "top_leaf_frames_pct": {k: pct(v) for k, v in self_time.most_common(20)}}


def invoke_children(raw: Path, function: str) -> dict[str, float]:
    """Of the samples under `function` (a services/gateway frame), the share of each direct callee."""
    under: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = [f.strip() for f in stack.split(";")]
        for i, fr in enumerate(frames):
            if fr.startswith(function + " (") and "services/gateway" in fr:
                total += int(count)
                callee = frames[i + 1] if i + 1 < len(frames) else "(self)"
                under[re.sub(r":\d+\)$", ")", callee)] += int(count)
                break
    return {k: round(100.0 * v / max(1, total), 1) for k, v in under.most_common(12)}


# ---- main ---------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each wrk run")
    ap.add_argument("--profile", action="store_true", help="py-spy the gateway during one more 100-client run")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")
    name = "bench-warm"
    tmp = Path(tempfile.mkdtemp(prefix="levers9-bench-wrk-"))
    script = tmp / "report.lua"
    script.write_text(REPORT_LUA)
    results: dict[str, list[dict]] = {"direct": [], "gateway": []}
    profile = None
    load_before = os.getloadavg()
    try:
        with running_stack() as stack:
            stack.deploy(WARM_APP, "bench_warm")
            r = stack.http.post(f"/endpoint/{name}", json={})  # cold start: the container stays for 600 s
            r.raise_for_status()
            live = [c for c in stack.containers(name) if c["status"] == "ready"]
            if len(live) != 1:
                raise RuntimeError(f"expected one ready container of {name}, found {live}")
            address = live[0]["address"]
            gw_pid = stack.pid("gateway")
            auth = {"Authorization": f"Bearer {stack.token}"}
            targets = {"direct": (f"{address}/", {}),
                       "gateway": (f"{stack.gateway_url}/endpoint/{name}", auth)}
            groups = {"gateway": lambda: [gw_pid], "runner": runner_pids}
            log(f"container {live[0]['container_id']} at {address}; warming both paths")
            for target, (url, headers) in targets.items():
                wrk(url, 10, 2, script, headers, groups)
            for clients in CLIENTS:
                for target, (url, headers) in targets.items():
                    res = wrk(url, clients, args.seconds, script, headers, groups)
                    results[target].append(res)
                    log(f"{target:>7} {clients:>3} clients: {res['rps']:>8.0f} req/s  p50 {res['p50_ms']:.2f} ms  "
                        f"p99 {res['p99_ms']:.2f} ms  errors {res['errors']}  cores {res['cpu_cores']}")
            if args.profile:
                profile = profile_gateway(gw_pid, *targets["gateway"], script, args.seconds, tmp)
                if "error" not in profile:
                    profile["invoke_callees_pct"] = invoke_children(tmp / "gateway.pyspy.txt", "invoke")
                    profile["proxy_callees_pct"] = invoke_children(tmp / "gateway.pyspy.txt", "proxy")
                    profile["resolve_callees_pct"] = invoke_children(tmp / "gateway.pyspy.txt", "resolve")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()

    comparison = []
    print(f"\nwarm calls, wrk -t1, {args.seconds:.0f} s per run, one container (concurrency 100), all on this machine:")
    print(f"{'clients':>7} | {'direct req/s':>12} {'p50 ms':>7} {'p99 ms':>7} | {'gateway req/s':>13} {'p50 ms':>7} "
          f"{'p99 ms':>7} | {'added p50':>9} {'gw % of direct':>14}")
    for d, g in zip(results["direct"], results["gateway"]):
        added, share = round(g["p50_ms"] - d["p50_ms"], 3), round(100.0 * g["ok_rps"] / max(1e-9, d["ok_rps"]), 1)
        comparison.append({"clients": d["clients"], "added_p50_ms": added, "added_p99_ms": round(g["p99_ms"] - d["p99_ms"], 3),
                           "gateway_pct_of_direct_rps": share})
        print(f"{d['clients']:>7} | {d['rps']:>12.0f} {d['p50_ms']:>7.2f} {d['p99_ms']:>7.2f} | {g['rps']:>13.0f} "
              f"{g['p50_ms']:>7.2f} {g['p99_ms']:>7.2f} | {added:>9.2f} {share:>13.1f}%")
    at1 = next(c for c in comparison if c["clients"] == 1)
    at100 = next(c for c in comparison if c["clients"] == 100)
    print(f"\np50 added by the gateway (1 client): {at1['added_p50_ms']:.2f} ms (target <= {TARGET_ADDED_P50_MS:.0f}): "
          f"{verdict(at1['added_p50_ms'], TARGET_ADDED_P50_MS, higher_is_better=False)}")
    print(f"gateway throughput at 100 clients: {at100['gateway_pct_of_direct_rps']:.1f}% of direct "
          f"(target >= {TARGET_THROUGHPUT_PCT:.0f}%): {verdict(at100['gateway_pct_of_direct_rps'], TARGET_THROUGHPUT_PCT)}")
    if profile and "error" not in profile:
        print(f"\ngateway profile at 100 clients ({profile['samples']} samples on CPU, "
              f"{profile['load']['rps']:.0f} req/s while sampled):")
        print("  functions of services/gateway (inclusive %):")
        for k, v in profile["gateway_functions_inclusive_pct"].items():
            print(f"    {v:>5.1f}%  {k}")
        print("  where the CPU is spent (leaf frame's library, %):")
        for k, v in profile["leaf_buckets_pct"].items():
            print(f"    {v:>5.1f}%  {k}")
        for fn in ("invoke", "proxy", "resolve"):
            print(f"  under {fn}() (direct callees, %): {profile[f'{fn}_callees_pct']}")
    elif profile:
        print(profile["error"])
    write_results("warm_calls", {
        "app": "bench-warm: trivial handler, cpu 1, 256Mi, concurrency 100, max_containers 1, keep_warm 600 s",
        "load_generator": f"wrk 4.x, -t1 -c<clients> -d{args.seconds:g}s, GET, keep-alive, on this machine",
        "stack": "levers9 up on this machine: one local worker (min_warm=1, max_workers=1), runc runtime",
        "loadavg_before": load_before, "loadavg_after": load_after,
        "direct": results["direct"], "gateway": results["gateway"], "comparison": comparison,
        "targets": {"added_p50_ms": TARGET_ADDED_P50_MS, "gateway_pct_of_direct_at_100": TARGET_THROUGHPUT_PCT},
        "verdicts": {"added_p50": verdict(at1["added_p50_ms"], TARGET_ADDED_P50_MS, higher_is_better=False),
                     "throughput_at_100": verdict(at100["gateway_pct_of_direct_rps"], TARGET_THROUGHPUT_PCT)},
        "profile": profile,
    })


if __name__ == "__main__":
    main()
