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

from _common import CpuMeter, log, verdict, write_results  # noqa: E402
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


def _process_cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process, threads that already exited included (the runner starts a
    thread per connection: summing the live threads' schedstat would lose the ones that ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


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
                v = _process_cpu_seconds(pid)
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
    cpu_ms = {k: round(v * secs * 1000 / max(1, r["requests"]), 3) for k, v in cpu.cores.items()
              if k in ("gateway", "runner")}
    return {"clients": clients, "requests": r["requests"], "seconds": round(secs, 2),
            "rps": round(r["requests"] / secs, 1), "errors": r["errors"],
            "ok_rps": round((r["requests"] - errors) / secs, 1),
            "p50_ms": r["latency_us"]["p50"] / 1000, "p90_ms": r["latency_us"]["p90"] / 1000,
            "p99_ms": r["latency_us"]["p99"] / 1000, "max_ms": r["latency_us"]["max"] / 1000,
            "mean_ms": round(r["latency_us"]["mean"] / 1000, 3), "cpu_cores": cpu.cores,
            "cpu_ms_per_request": cpu_ms}


def header_body_gap(address: str, requests: int = 20) -> dict:
    """On one keep-alive connection, GET the runner `requests` times and measure, per answer, the time
    from its first bytes (status line + headers) to its last (the body). The runner writes the headers
    and the body with two send()s on a socket without TCP_NODELAY: Nagle holds the body until the
    headers are ACKed, and the client delays that ACK (up to 40 ms on Linux)."""
    import socket
    host, port = address.split("//")[1].rsplit(":", 1)
    gaps, totals = [], []
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for _ in range(requests):
            t0 = time.perf_counter()
            sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            buf = sock.recv(65536)
            first = time.perf_counter()
            while b"\r\n\r\n" not in buf:
                buf += sock.recv(65536)
            head, _, body = buf.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
            while len(body) < length:
                body += sock.recv(65536)
            last = time.perf_counter()
            gaps.append((last - first) * 1000)
            totals.append((last - t0) * 1000)
    gaps.sort()
    totals.sort()
    return {"requests": requests, "gap_p50_ms": round(gaps[len(gaps) // 2], 3), "gap_max_ms": round(gaps[-1], 3),
            "total_p50_ms": round(totals[len(totals) // 2], 3)}


# ---- profile ------------------------------------------------------------------------------------

FRAME_LINE = re.compile(r":\d+\)$")
GATEWAY_FILE = re.compile(r"\((?:.*/)?gateway/(service|router)\.py\)$")
# what the samples go to: (label, frames whose text contains one of these); inclusive, so they overlap
SPOTS = (
    ("httpx AsyncClient.send: the upstream request (httpx + httpcore + h11 client)", ("AsyncClient.send (",)),
    ("  of it, httpcore AsyncConnectionPool._assign_requests_to_connections (scans every pooled connection)",
     ("AsyncConnectionPool._assign_requests_to_connections (",)),
    ("    of that, has_expired() on each pooled connection (socket readable? get_extra_info)",
     ("AsyncHTTPConnection.has_expired (",)),
    ("starlette StreamingResponse: streaming the answer back (anyio task group, aiter_raw)",
     ("StreamingResponse.",)),
    ("asyncpg: a query per call (resolve: the deployment row)", ("Connection.fetchrow (",)),
    ("httpcore current_async_library: `import sniffio` fails (not installed) on every call",
     ("current_async_library (",)),
    ("logging (httpx logs every proxied request at INFO)", ("Logger._log (",)),
    ("OpenTelemetry spans", ("opentelemetry/", "(trace/__init__.py)")),
    ("socket writes (kernel: veth/bridge/TCP of the receiver; preemption by the woken peer)",
     ("_SelectorSocketTransport.write (",)),
    ("uvicorn h11 server: parsing requests, writing answers", ("H11Protocol.", "RequestResponseCycle.send (")),
    ("FastAPI dependencies (auth: Depends(user))", ("solve_dependencies (",)),
)


def read_raw(raw: Path) -> list[tuple[list[str], int]]:
    out = []
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            out.append(([FRAME_LINE.sub(")", f.strip()) for f in stack.split(";")], int(count)))
    return out


def analyse(stacks: list[tuple[list[str], int]]) -> dict:
    total = sum(n for _, n in stacks)
    pct = lambda n: round(100.0 * n / max(1, total), 1)  # noqa: E731
    gateway: collections.Counter = collections.Counter()
    spots: collections.Counter = collections.Counter()
    leaves: collections.Counter = collections.Counter()
    for frames, n in stacks:
        for key in {f for f in frames if GATEWAY_FILE.search(f)}:
            gateway[key] += n
        for label, needles in SPOTS:
            if any(needle in f for f in frames for needle in needles):
                spots[label] += n
        leaves[frames[-1]] += n
    return {"samples": total,
            "gateway_functions_inclusive_pct": {k: pct(v) for k, v in gateway.most_common(20)},
            "spots_inclusive_pct": {k: pct(spots[k]) for k, _ in SPOTS},
            "top_leaf_frames_pct": {k: pct(v) for k, v in leaves.most_common(15)}}


def callees(stacks: list[tuple[list[str], int]], function: str) -> dict[str, float]:
    """Of the samples under a services/gateway function (e.g. "GatewayService.proxy"), each direct callee's share."""
    under: collections.Counter = collections.Counter()
    total = 0
    for frames, n in stacks:
        for i, fr in enumerate(frames):
            if fr.startswith(function + " (") and GATEWAY_FILE.search(fr):
                total += n
                under[frames[i + 1] if i + 1 < len(frames) else "(itself)"] += n
                break
    return {k: round(100.0 * v / max(1, total), 1) for k, v in under.most_common(10)}


def profile_gateway(pid: int, url: str, headers: dict[str, str], script: Path, seconds: float, raw: Path) -> dict:
    """py-spy samples the gateway (on-CPU stacks only) while wrk drives it at 100 clients."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return {"error": "py-spy is not installed: /tmp/venv/bin/pip install py-spy"}
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds)) + 1),
                             "--rate", "250", "--format", "raw", "--output", str(raw), "--nonblocking"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.5)
    load = wrk(url, 100, seconds, script, headers, {"gateway": lambda: [pid]})
    spy_out, _ = proc.communicate(timeout=seconds + 60)
    if proc.returncode != 0 or not raw.exists():
        return {"error": f"py-spy failed ({proc.returncode}): {spy_out[-2000:]}"}
    stacks = read_raw(raw)
    out = {"rate_hz": 250, "load": load, "raw_stacks": str(raw), **analyse(stacks)}
    for fn in ("GatewayService.invoke", "GatewayService.proxy"):
        out[f"{fn} callees_pct"] = callees(stacks, fn)
    return out


# ---- main ---------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each wrk run")
    ap.add_argument("--profile", action="store_true", help="py-spy the gateway during one more 100-client run")
    ap.add_argument("--keep-profile", metavar="FILE", default="",
                    help="with --profile: keep py-spy's raw stacks there (flamegraph.pl input)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install -y wrk")
    name = "bench-warm"
    tmp = Path(tempfile.mkdtemp(prefix="levers9-bench-wrk-"))
    script = tmp / "report.lua"
    script.write_text(REPORT_LUA)
    results: dict[str, list[dict]] = {"direct": [], "gateway": []}
    profile = gap = None
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
            gap = header_body_gap(address)
            log(f"runner: headers -> body of one answer, p50 {gap['gap_p50_ms']:.1f} ms ({gap})")
            for clients in CLIENTS:
                for target, (url, headers) in targets.items():
                    res = wrk(url, clients, args.seconds, script, headers, groups)
                    results[target].append(res)
                    log(f"{target:>7} {clients:>3} clients: {res['rps']:>8.0f} req/s  p50 {res['p50_ms']:.2f} ms  "
                        f"p99 {res['p99_ms']:.2f} ms  errors {res['errors']}  cores {res['cpu_cores']}")
            if args.profile:
                raw = Path(args.keep_profile) if args.keep_profile else tmp / "gateway.pyspy.txt"
                profile = profile_gateway(gw_pid, *targets["gateway"], script, args.seconds, raw)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()

    comparison = []
    print(f"\nwarm calls, wrk -t1, {args.seconds:.0f} s per run, one container (concurrency 100), all on this machine:")
    print(f"{'clients':>7} | {'direct req/s':>12} {'p50 ms':>7} {'p99 ms':>7} | {'gateway req/s':>13} {'p50 ms':>7} "
          f"{'p99 ms':>7} | {'added p50':>9} {'gw % of direct':>14} | {'gw CPU ms/req':>13}")
    for d, g in zip(results["direct"], results["gateway"]):
        added, share = round(g["p50_ms"] - d["p50_ms"], 3), round(100.0 * g["ok_rps"] / max(1e-9, d["ok_rps"]), 1)
        comparison.append({"clients": d["clients"], "added_p50_ms": added,
                           "added_p99_ms": round(g["p99_ms"] - d["p99_ms"], 3),
                           "gateway_pct_of_direct_rps": share})
        print(f"{d['clients']:>7} | {d['rps']:>12.0f} {d['p50_ms']:>7.2f} {d['p99_ms']:>7.2f} | {g['rps']:>13.0f} "
              f"{g['p50_ms']:>7.2f} {g['p99_ms']:>7.2f} | {added:>9.2f} {share:>13.1f}% | "
              f"{g['cpu_ms_per_request'].get('gateway', 0):>13.2f}")
    print("cores busy during the gateway runs (gateway / runner / wrk / everything else on the machine): " +
          "; ".join(f"{g['clients']} clients: {g['cpu_cores']}" for g in results["gateway"]))
    if gap:
        print(f"runner: {gap['gap_p50_ms']:.1f} ms p50 between an answer's headers and its body (one keep-alive "
              f"connection; two send()s without TCP_NODELAY: Nagle + delayed ACK)")
    at1 = next(c for c in comparison if c["clients"] == 1)
    at100 = next(c for c in comparison if c["clients"] == 100)
    print(f"\np50 added by the gateway (1 client): {at1['added_p50_ms']:.2f} ms (target <= {TARGET_ADDED_P50_MS:.0f}): "
          f"{verdict(at1['added_p50_ms'], TARGET_ADDED_P50_MS, higher_is_better=False)}")
    print(f"gateway throughput at 100 clients: {at100['gateway_pct_of_direct_rps']:.1f}% of direct "
          f"(target >= {TARGET_THROUGHPUT_PCT:.0f}%): "
          f"{verdict(at100['gateway_pct_of_direct_rps'], TARGET_THROUGHPUT_PCT)}")
    if profile and "error" not in profile:
        print(f"\ngateway profile at 100 clients (py-spy, {profile['samples']} samples, "
              f"{profile['load']['rps']:.0f} req/s and {profile['load']['cpu_cores']} cores while sampled):")
        print("  functions of services/gateway (inclusive % of samples):")
        for k, v in profile["gateway_functions_inclusive_pct"].items():
            print(f"    {v:>5.1f}%  {k}")
        print("  where it goes (inclusive %, overlapping):")
        for k, v in profile["spots_inclusive_pct"].items():
            print(f"    {v:>5.1f}%  {k}")
        for fn in ("GatewayService.invoke", "GatewayService.proxy"):
            print(f"  under {fn} (direct callees, %):")
            for k, v in profile[f"{fn} callees_pct"].items():
                print(f"    {v:>5.1f}%  {k}")
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
        "runner_header_body_gap": gap,
        "profile": profile,
    })


if __name__ == "__main__":
    main()
