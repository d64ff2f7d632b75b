"""Benchmark: levers9 functions against Ray's tasks, in one run on this machine (issue 26, item 5).

Ray is what many teams use instead for remote Python functions on their own machines. Both sides run
the same trivial function (x -> 2x) one after the other in one run:

  map     levers9 `.map` over --inputs inputs (`@app.function(max_containers=4, concurrency=8)`, its
          sandboxes started first) against Ray's `ray.get([f.remote(x) for x in inputs])` after
          `ray.init(num_cpus=2)` (its workers started first): inputs/s;
  warm    --warm sequential `.remote()` round trips on a warm sandbox against `ray.get(f.remote(x))`:
          p50/p99 ms;
  memory  the memory (PSS: shared pages divided among their sharers) of a whole idle `levers9 up` stack (every component and what it
          started: NATS, Postgres, S3, the services, the worker and its warm sandboxes) against Ray's
          (the driver, GCS, raylet, dashboard agent and its workers), after the runs above.

Ray is a bench-only dependency and lives in a venv of its own (never in the platform's):

  python3 -m venv /tmp/venv-ray && /tmp/venv-ray/bin/pip install ray==2.60.0
  python bench/bench_vs_ray.py [--inputs 10000] [--warm 200] [--ray-python /tmp/venv-ray/bin/python]

Targets: `.map` throughput and warm p50 at least Ray's (every levers9 call still in its container);
idle memory of the stack <= 1 GiB. The ratios are reported whichever way they fall.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import log, percentiles, verdict, write_results  # noqa: E402
from bench_cold_call import running_stack  # noqa: E402

from levers9 import App  # noqa: E402

TARGET_STACK_MIB = 1024.0

app = App("bench-vs-ray")


@app.function(cpu=0.5, memory="256Mi", keep_warm_seconds=600, max_containers=4, concurrency=8)
def double(x):
    return 2 * x


RAY_SIDE = r'''
import json, sys, time
import psutil, ray

inputs, warm = int(sys.argv[1]), int(sys.argv[2])
began = time.perf_counter()
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

@ray.remote
def double(x):
    return 2 * x

ray.get([double.remote(i) for i in range(32)])  # its workers started
init_s = time.perf_counter() - began
t = time.perf_counter()
results = ray.get([double.remote(i) for i in range(inputs)])
map_s = time.perf_counter() - t
assert results == [2 * i for i in range(inputs)]
laps = []
for i in range(warm):
    t = time.perf_counter()
    ray.get(double.remote(i))
    laps.append((time.perf_counter() - t) * 1000)
me = psutil.Process()
rss = sum(p.memory_full_info().pss for p in [me, *me.children(recursive=True)] if p.is_running())
print("RAY_JSON " + json.dumps({"init_and_first_s": round(init_s, 3), "map_s": map_s, "warm_ms": laps,
                                "rss_bytes": rss}))
ray.shutdown()
'''


def levers9_side(inputs: int, warm: int) -> dict:
    list(double.map(range(32)))  # up to 4 sandboxes started and warm
    began = time.perf_counter()
    results = list(double.map(range(inputs)))
    map_s = time.perf_counter() - began
    assert results == [2 * i for i in range(inputs)], "map returned wrong or out-of-order results"
    laps = []
    for i in range(warm):
        t = time.perf_counter()
        double.remote(i)
        laps.append((time.perf_counter() - t) * 1000)
    return {"map_inputs_per_s": round(inputs / map_s, 1), "warm": percentiles(laps)}


def proportional(p: psutil.Process) -> int:
    """A process's proportional set size: its own pages, and each shared page divided among the
    processes that share it (Postgres's shared buffers, counted whole in every backend's RSS, once)."""
    return p.memory_full_info().pss


def stack_rss(state: dict) -> tuple[int, dict[str, int], dict[int, int]]:
    """Memory (PSS) of every component of the stack and of everything it started, each process once."""
    seen: dict[int, int] = {}
    by_component: dict[str, int] = {}
    for name, comp in state["components"].items():
        try:
            root = psutil.Process(int(comp["pid"]))
            procs = [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, KeyError, ValueError):
            continue
        total = 0
        for p in procs:
            if p.pid in seen:
                continue
            try:
                seen[p.pid] = proportional(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += seen[p.pid]
        by_component[name] = total
    return sum(seen.values()), by_component, seen


def containers_pss(container_ids: set[str], counted: dict[int, int]) -> int:
    """Memory (PSS) of the processes in this stack's containers (cgroup /levers9/<container id>: runc
    reparents them, so they are no component's descendants), each process once."""
    total = 0
    for p in psutil.process_iter():
        if p.pid in counted:
            continue
        try:
            with open(f"/proc/{p.pid}/cgroup") as f:
                cgroup = f.read()
            if any(f"/levers9/{cid}" in cgroup for cid in container_ids):
                counted[p.pid] = proportional(p)
                total += counted[p.pid]
        except (OSError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def ray_side(python: str, inputs: int, warm: int) -> dict:
    out = subprocess.run([python, "-c", RAY_SIDE, str(inputs), str(warm)], capture_output=True, text=True,
                         timeout=900)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RAY_JSON ")), None)
    if line is None:
        raise RuntimeError(f"the Ray side failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    doc = json.loads(line.removeprefix("RAY_JSON "))
    return {"map_inputs_per_s": round(inputs / doc["map_s"], 1), "warm": percentiles(doc["warm_ms"]),
            "init_and_first_s": doc["init_and_first_s"], "rss_mib": round(doc["rss_bytes"] / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=10_000)
    ap.add_argument("--warm", type=int, default=200)
    ap.add_argument("--ray-python", default="/tmp/venv-ray/bin/python")
    args = ap.parse_args()
    if not Path(args.ray_python).exists():
        raise SystemExit(f"no {args.ray_python}: python3 -m venv /tmp/venv-ray && /tmp/venv-ray/bin/pip install ray==2.60.0")
    load_before = os.getloadavg()
    with running_stack() as stack:
        os.environ["LEVERS9_HOME"] = str(stack.home)
        log("levers9: map and warm calls ...")
        ours = levers9_side(args.inputs, args.warm)
        total, parts, counted = stack_rss(stack.state())
        ids = {c["container_id"] for c in stack.http.get("/api/v1/containers").json()}
        parts["containers"] = containers_pss(ids, counted)
        total += parts["containers"]
        ours["containers"] = len(ids)
        ours["stack_rss_mib"] = round(total / 2**20, 1)
        ours["stack_rss_mib_by_component"] = {k: round(v / 2**20, 1) for k, v in sorted(parts.items())}
    log("ray: map and warm calls ...")
    theirs = ray_side(args.ray_python, args.inputs, args.warm)
    doc = {"inputs": args.inputs, "warm_calls": args.warm, "load_before": load_before, "levers9": ours, "ray": theirs,
           "map_ratio_levers9_to_ray": round(ours["map_inputs_per_s"] / theirs["map_inputs_per_s"], 3),
           "warm_p50_ratio_levers9_to_ray": round(ours["warm"]["p50_ms"] / theirs["warm"]["p50_ms"], 3),
           "verdicts": {"map": verdict(ours["map_inputs_per_s"], theirs["map_inputs_per_s"]),
                        "warm_p50": verdict(ours["warm"]["p50_ms"], theirs["warm"]["p50_ms"], higher_is_better=False),
                        "stack_memory": verdict(ours["stack_rss_mib"], TARGET_STACK_MIB, higher_is_better=False)}}
    write_results("bench_vs_ray", doc)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
