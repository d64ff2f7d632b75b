"""Benchmark: workers on other hosts (README "Workers on other hosts"). Not in CI; needs root, runc, nft.

Two parts, each its own `levers9 up` stack in a temporary home (NATS with auth, as `up` runs it),
`levers9 down` after it whatever happens, and a check that no `l9h-*` host namespace is left:

calls       pools `machine` (backend local: `up`'s own worker local-1) and `hosts` (backend netns: one
            worker that is its own host, levers9.runtime.hosts). The same small endpoint is deployed
            twice, `bh-local` (pool machine) and `bh-remote` (pool hosts), and measured side by side in
            one run, calls alternating between the two:
              first   the first call of each (code fetched into the worker's cache): reported apart;
              cold    --cold times: stop the app's container, wait until the gateway shows none live,
                      time one call through the gateway (a fresh container; the same host's bridge vs
                      the other host's address, DNATed inside it to the container);
              warm    --warm sequential calls through the gateway on one keep-alive connection;
              direct  --direct sequential calls straight to the container's address (no gateway): what
                      the path to the host costs alone.
placement   1,000 bare containers (POST /api/v1/containers, cpu 100m, 128 MiB, pool `sim`) over 20
            SIMULATED workers (bench/sim_workers.py: each its own process in its own host namespace,
            its own NATS user, registering, beating and answering ContainerStarted/ContainerReady for
            what is placed on it; NO container runs). The pool `sim` has min_warm 0 and max_workers 0,
            so the pool controller starts no worker for it. Measured: first request -> all 1,000 ready
            as GET /api/v1/containers shows them (polled every 0.5 s from the first request on: the
            polls are in the gateway's CPU), each request's latency, placements per host, and CPU
            seconds of the gateway, scheduler, pool controller, NATS, Postgres and the simulated workers
            over that span, and the whole machine's busy cores. This measures the control plane, not
            containers.

  flock /tmp/l9-e2e.lock python bench/bench_hosts.py calls [--cold 5 --warm 500] [--json]
  flock /tmp/l9-e2e.lock python bench/bench_hosts.py placement [--hosts 20 --containers 1000] [--json]

Results: bench/results/hosts_calls.json, bench/results/hosts_placement.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_seconds, log, percentiles, write_results  # noqa: E402
from bench_cold_call import Stack  # noqa: E402

NETNS_DIR = Path("/run/netns")
CALLS_POOLS = ('[pools.machine]\nbackend = "local"\nmin_warm = 0\nmax_workers = 0\n\n'
               '[pools.hosts]\nbackend = "netns"\nmin_warm = 1\nmax_workers = 1\nidle_timeout_s = 600\n\n'
               '[pools.build]\nbackend = "local"\nmin_warm = 0\nmax_workers = 0\n')
PLACEMENT_POOLS = ('[pools.machine]\nbackend = "local"\nmin_warm = 0\nmax_workers = 0\n\n'
                   '[pools.sim]\nbackend = "local"\nmin_warm = 0\nmax_workers = 0\n\n'
                   '[pools.build]\nbackend = "local"\nmin_warm = 0\nmax_workers = 0\n')
APP = '''
from levers9 import App

app = App("NAME")


@app.endpoint(name="NAME", cpu=0.25, memory="128Mi", keep_warm_seconds=600, timeout=60, pool="POOL")
def handler():
    return {"ok": True}
'''
TARGETS = {"local": ("bh-local", "machine"), "remote": ("bh-remote", "hosts")}


def host_namespaces() -> list[str]:
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith("l9h-")) if NETNS_DIR.is_dir() else []


@contextlib.contextmanager
def stack_with(pools: str, keep_home: bool) -> Iterator[Stack]:
    """`levers9 up` in a new home with this pools file and `up`'s own worker in pool `machine`;
    `levers9 down` after; the hosts it made must be gone then."""
    tmp = tempfile.mkdtemp(prefix="levers9-bench-hosts-")
    os.chmod(tmp, 0o755)
    stack = Stack(Path(tmp))
    (stack.home / "pools.toml").write_text(pools)
    stack.env = {k: v for k, v in stack.env.items() if not k.startswith("LEVERS9_")}
    stack.env.update(LEVERS9_HOME=tmp, LEVERS9_POOLS_FILE=str(stack.home / "pools.toml"),
                     LEVERS9_WORKER_POOL="machine")
    before = set(host_namespaces())
    try:
        stack.up()
        yield stack
    finally:
        stack.down()
        left = sorted(set(host_namespaces()) - before)
        if left:
            log(f"WARNING: host namespaces left after `levers9 down`: {left}")
        if keep_home:
            log(f"home kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def wait_for(what: str, fn: Callable[[], object], timeout: float, every: float = 0.5) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"{what}: not reached within {timeout:.0f} s")


def workers(stack: Stack) -> list[dict]:
    assert stack.http is not None
    r = stack.http.get("/api/v1/workers")
    r.raise_for_status()
    return r.json()


def ready_in(stack: Stack, pool: str, feature: str = "") -> list[dict]:
    return [w for w in workers(stack) if w["pool"] == pool and w["status"] == "ready"
            and (not feature or feature in w["features"])]


# ---- calls ---------------------------------------------------------------------------------------

def timed_post(client: httpx.Client, url: str) -> float:
    began = time.perf_counter()
    r = client.post(url, json={})
    elapsed = (time.perf_counter() - began) * 1000
    r.raise_for_status()
    return elapsed


def live_container(stack: Stack, name: str) -> dict:
    live = [c for c in stack.containers(name) if c["status"] == "ready"]
    if len(live) != 1:
        raise RuntimeError(f"expected one ready container of {name}, found {live}")
    return live[0]


def stop_live(stack: Stack, name: str) -> None:
    assert stack.http is not None
    for c in stack.containers(name):
        stack.http.post(f"/api/v1/containers/{c['container_id']}/stop").raise_for_status()
    stack.wait_no_live(name, timeout=60)


def deploy_both(stack: Stack) -> dict[str, dict]:
    """Deploy the app twice, make each one's first call; {target: first_ms, worker, address}."""
    out = {}
    for target, (name, pool) in TARGETS.items():
        stack.deploy(APP.replace("NAME", name).replace("POOL", pool), name.replace("-", "_"))
    assert stack.http is not None
    for target, (name, pool) in TARGETS.items():
        first = timed_post(stack.http, f"/endpoint/{name}")
        c = live_container(stack, name)
        out[target] = {"first_ms": round(first, 1), "worker_id": c["worker_id"], "address": c["address"]}
        log(f"{target}: first call {first:.0f} ms on worker {c['worker_id']}, container at {c['address']}")
    return out


def cold_calls(stack: Stack, n: int) -> dict[str, list[float]]:
    assert stack.http is not None
    out: dict[str, list[float]] = {t: [] for t in TARGETS}
    for i in range(n):
        for target, (name, _) in TARGETS.items():
            stop_live(stack, name)
            time.sleep(0.3)  # let the worker finish the stop (its bridge address, its firewall rules)
            out[target].append(timed_post(stack.http, f"/endpoint/{name}"))
        log(f"cold {i + 1}/{n}: " + ", ".join(f"{t} {v[-1]:.0f} ms" for t, v in out.items()))
    return out


def warm_calls(urls: dict[str, str], n: int, headers: dict[str, str]) -> dict[str, list[float]]:
    """n sequential calls per target, alternating targets, each target on its own keep-alive connection."""
    clients = {t: httpx.Client(timeout=30, headers=headers) for t in urls}
    out: dict[str, list[float]] = {t: [] for t in urls}
    try:
        for t, url in urls.items():  # connect and warm up, not counted
            for _ in range(20):
                timed_post(clients[t], url)
        for _ in range(n):
            for t, url in urls.items():
                out[t].append(timed_post(clients[t], url))
    finally:
        for c in clients.values():
            c.close()
    return out


def run_calls(args: argparse.Namespace) -> dict:
    with stack_with(CALLS_POOLS, args.keep_home) as stack:
        wait_for("local-1 ready in pool machine", lambda: ready_in(stack, "machine", "runc"), 300)
        host = wait_for("a netns worker ready in pool hosts", lambda: ready_in(stack, "hosts", "runc"), 600)
        log(f"host worker {host[0]['worker_id']} at {host[0]['address']}")  # type: ignore[index]
        first = deploy_both(stack)
        cold = cold_calls(stack, args.cold)
        gateway = {t: f"{stack.gateway_url}/endpoint/{name}" for t, (name, _) in TARGETS.items()}
        warm = warm_calls(gateway, args.warm, {"Authorization": f"Bearer {stack.token}"})
        direct_urls = {t: live_container(stack, name)["address"] + "/" for t, (name, _) in TARGETS.items()}
        direct = warm_calls(direct_urls, args.direct, {}) if args.direct else {}
        home = stack.home
    return {"first": first, "cold": {t: percentiles(v) for t, v in cold.items()},
            "cold_raw_ms": {t: [round(x, 1) for x in v] for t, v in cold.items()},
            "warm_gateway": {t: percentiles(v) for t, v in warm.items()},
            "warm_direct": {t: percentiles(v) for t, v in direct.items()},
            "host_namespaces_left": host_namespaces(), "home": str(home),
            "note": "local = pool machine (up's worker, containers on the machine's bridge); remote = pool hosts "
                    "(a netns worker, containers reached at its host address through its DNAT)"}


def print_calls(doc: dict) -> None:
    rows = [("first call (code fetched)", "first", None), ("cold call p50", "cold", "p50_ms"),
            ("cold call max", "cold", "max_ms"), ("warm via gateway p50", "warm_gateway", "p50_ms"),
            ("warm via gateway p90", "warm_gateway", "p90_ms"), ("warm via gateway p99", "warm_gateway", "p99_ms"),
            ("warm direct p50", "warm_direct", "p50_ms"), ("warm direct p99", "warm_direct", "p99_ms")]
    print(f"{'ms':<28}{'same host (local)':>20}{'other host (netns)':>20}")
    for label, key, field in rows:
        vals = []
        for t in TARGETS:
            part = doc[key].get(t, {})
            v = part.get("first_ms") if field is None else part.get(field)
            vals.append("-" if v is None else f"{v:.2f}")
        print(f"{label:<28}{vals[0]:>20}{vals[1]:>20}")
    n = doc["cold"]["local"].get("n", 0), doc["warm_gateway"]["local"].get("n", 0)
    print(f"({n[0]} cold and {n[1]} warm calls per target, alternating)")


# ---- placement -----------------------------------------------------------------------------------

def cpu_of(stack: Stack, names: tuple[str, ...], sims: list) -> dict[str, float]:
    """CPU seconds so far of the services named, NATS, Postgres (all backends) and the simulated workers."""
    import psutil

    out = {name: cpu_seconds(stack.pid(name)) for name in names}
    for server in ("nats", "postgres"):
        try:
            root = psutil.Process(int((stack.home / "run" / f"{server}.pid").read_text().split()[0]))
            out[server] = sum(cpu_seconds(p.pid) for p in [root, *root.children(recursive=True)])
        except (OSError, ValueError, psutil.Error):
            out[server] = 0.0
    sim_pids = []
    for sim in sims:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(sim.proc.pid)  # nsenter execs python: the same pid
            sim_pids += [proc.pid, *(c.pid for c in proc.children(recursive=True))]
    out["simulated_workers"] = sum(cpu_seconds(p) for p in sim_pids)
    return out


def request_all(gateway_url: str, token: str, n: int, pool: str, concurrency: int) -> tuple[list[str], list[float]]:
    """n POST /api/v1/containers, `concurrency` at a time; (the container ids, each request's ms)."""
    import asyncio

    body = {"cpu_millicores": 100, "memory_mib": 128, "pool": pool}
    took: list[float] = []

    async def go() -> list[str]:
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=gateway_url, timeout=60,
                                     headers={"Authorization": f"Bearer {token}"}) as client:
            async def one() -> str:
                async with sem:
                    began = time.perf_counter()
                    r = await client.post("/api/v1/containers", json=body)
                    took.append((time.perf_counter() - began) * 1000)
                    r.raise_for_status()
                    return r.json()["container_id"]
            return list(await asyncio.gather(*(one() for _ in range(n))))

    return asyncio.run(go()), took


def count_ready(stack: Stack, pool: str) -> tuple[dict[str, int], dict[str, int]]:
    """({container id: 1} of the ready ones, ready per worker) of pool `pool`, as the gateway lists them
    (all containers of this stack's pool `sim` are the benchmark's); raises when one failed."""
    assert stack.http is not None
    r = stack.http.get("/api/v1/containers", params={"all": "true"})
    r.raise_for_status()
    rows = [c for c in r.json() if c.get("pool") == pool]
    failed = [c for c in rows if c["status"] == "failed"]
    if failed:
        raise RuntimeError(f"{len(failed)} containers failed, e.g. {failed[0]['reason']}")
    per: dict[str, int] = {}
    for c in rows:
        if c["status"] == "ready":
            per[c["worker_id"]] = per.get(c["worker_id"], 0) + 1
    return {c["container_id"]: 1 for c in rows if c["status"] == "ready"}, per


class Poller:
    """Polls the gateway's container list every 0.5 s from before the first request (a thread), so
    the ready count is seen while requests still go in; done when `n` are ready."""

    def __init__(self, stack: Stack, pool: str, n: int, began: float, timeout: float) -> None:
        import threading
        self.stack, self.pool, self.n, self.began, self.timeout = stack, pool, n, began, timeout
        self.progress: list[tuple[float, int]] = []
        self.ready: dict[str, int] = {}
        self.per: dict[str, int] = {}
        self.done_at = 0.0
        self.error = ""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            while time.monotonic() < deadline:
                self.ready, self.per = count_ready(self.stack, self.pool)
                now = time.perf_counter()
                self.progress.append((round(now - self.began, 2), len(self.ready)))
                if len(self.ready) >= self.n:
                    self.done_at = now
                    return
                time.sleep(0.5)
            self.error = f"only {len(self.ready)} of {self.n} ready within {self.timeout:.0f} s"
        except Exception as exc:  # noqa: BLE001 - reported by wait()
            self.error = f"{type(exc).__name__}: {exc}"

    def wait(self) -> None:
        self.thread.join()
        if self.error:
            raise RuntimeError(self.error)


def place(stack: Stack, args: argparse.Namespace, sims: list) -> dict:
    from _common import CpuMeter

    names = ("gateway", "scheduler", "pool-controller")
    cpu0, busy0 = cpu_of(stack, names, sims), CpuMeter._machine_busy()
    began = time.perf_counter()
    poller = Poller(stack, "sim", args.containers, began, args.timeout)
    poller.thread.start()
    ids, took = request_all(stack.gateway_url, stack.token, args.containers, "sim", args.concurrency)
    requested = time.perf_counter()
    log(f"{len(ids)} requests accepted in {requested - began:.1f} s")
    poller.wait()
    cpu1, busy1 = cpu_of(stack, names, sims), CpuMeter._machine_busy()
    missing = set(ids) - set(poller.ready)
    if missing:
        raise RuntimeError(f"{len(missing)} requested containers are not among the ready ones")
    counts = [poller.per.get(s.worker_id, 0) for s in sims]
    span = poller.done_at - began
    return {"containers": len(ids), "hosts": len(sims), "requests_s": round(requested - began, 2),
            "request_ms": percentiles(took), "all_ready_s": round(span, 2),
            "ready_per_s": round(len(ids) / max(1e-9, span), 1),
            "per_host": {"min": min(counts), "max": max(counts), "by_worker": dict(sorted(poller.per.items()))},
            "cpu_s": {k: round(cpu1[k] - cpu0[k], 2) for k in cpu1},
            "machine_busy_cores": round((busy1 - busy0) / max(1e-9, span), 2),
            "progress": poller.progress}


def run_placement(args: argparse.Namespace) -> dict:
    import sim_workers

    per_host = args.per_host_capacity
    with stack_with(PLACEMENT_POOLS, args.keep_home) as stack:
        nats_url = stack.state()["components"]["nats"]["url"]
        sims = sim_workers.start_hosts(stack.home, nats_url, args.hosts, "sim", per_host * 100, per_host * 128,
                                       netns=not args.root_namespace)
        reports: list[dict] = []
        try:
            wait_for(f"{args.hosts} simulated workers ready", lambda: len(ready_in(stack, "sim")) >= args.hosts, 120)
            log(f"{args.hosts} simulated workers ready ({'root namespace' if args.root_namespace else 'each its own host'})")
            time.sleep(2)  # let their start-up CPU settle before the span is measured
            result = place(stack, args, sims)
        finally:
            reports = sim_workers.stop_hosts(stack.home, sims)
        home = stack.home
    return {**result, "sim_reports": reports, "per_host_capacity": per_host,
            "netns": not args.root_namespace, "host_namespaces_left": host_namespaces(), "home": str(home),
            "note": "SIMULATED workers: registration, heartbeats, placements and Started/Ready reports are real "
                    "events through the real gateway, scheduler and NATS; no container runs"}


def print_placement(doc: dict) -> None:
    print(f"{doc['containers']} bare containers over {doc['hosts']} simulated hosts "
          f"({'each in its own netns' if doc['netns'] else 'root namespace'}, capacity {doc['per_host_capacity']} each)")
    print(f"{'requests accepted by the gateway':<40}{doc['requests_s']:>10.2f} s")
    print(f"{'first request -> all ready (gateway)':<40}{doc['all_ready_s']:>10.2f} s  ({doc['ready_per_s']}/s)")
    print(f"{'POST /api/v1/containers p50 / p99':<40}{doc['request_ms']['p50_ms']:>10.1f} / "
          f"{doc['request_ms']['p99_ms']:.1f} ms ({doc['args']['concurrency']} in flight)")
    print(f"{'placements per host min / max':<40}{doc['per_host']['min']:>6} / {doc['per_host']['max']}")
    for name, secs in doc["cpu_s"].items():
        print(f"{'CPU s ' + name:<40}{secs:>10.2f}")
    print(f"{'whole machine, busy cores (of 2)':<40}{doc['machine_busy_cores']:>10.2f}")


# ---- main ----------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").split("\n\n")[0])
    ap.add_argument("part", choices=("calls", "placement"))
    ap.add_argument("--cold", type=int, default=5, help="calls: cold calls per target")
    ap.add_argument("--warm", type=int, default=500, help="calls: warm calls per target through the gateway")
    ap.add_argument("--direct", type=int, default=200, help="calls: warm calls per target straight to the container")
    ap.add_argument("--hosts", type=int, default=20, help="placement: simulated hosts")
    ap.add_argument("--containers", type=int, default=1000, help="placement: bare containers requested")
    ap.add_argument("--per-host-capacity", type=int, default=60, help="placement: containers each host fits")
    ap.add_argument("--concurrency", type=int, default=16, help="placement: requests in flight at once")
    ap.add_argument("--timeout", type=float, default=300, help="placement: seconds to wait for all ready")
    ap.add_argument("--root-namespace", action="store_true", help="placement: simulated workers without netns")
    ap.add_argument("--keep-home", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the JSON summary too")
    args = ap.parse_args()
    load = os.getloadavg()
    doc = run_calls(args) if args.part == "calls" else run_placement(args)
    doc = {**doc, "args": vars(args), "loadavg_before": load, "loadavg_after": os.getloadavg()}
    write_results(f"hosts_{args.part}", doc)
    (print_calls if args.part == "calls" else print_placement)(doc)
    if args.json:
        print(json.dumps({k: v for k, v in doc.items() if k not in ("progress",)}, indent=1))


if __name__ == "__main__":
    main()
