"""Benchmark: Python function calls through the gateway, in one run side by side with their baselines.

Starts the whole stack (`levers9 up` in a temporary home, one local worker with the runc runtime),
then, with functions defined in this file's __main__ (pickled by value, no deploy step):

  warm      `.remote()` round trips on a warm sandbox, against the same function called locally and
            against a bare gRPC Echo to the gateway (same channel, same token): the p50 the platform
            adds over Echo and over a local call (target: <= 5 ms added);
  map       `.map` over 1,000 small inputs with max_containers=4 (the sandboxes started first), in
            inputs/s (target: >= 500/s on this machine);
  cold      a `.remote()` of a function no sandbox exists for, split into its phases from the event
            log (gateway accepted -> ContainerRequested -> ContainerScheduled -> ContainerStarted ->
            ContainerReady -> FunctionCallStarted -> FunctionCallFinished -> the caller has the value).

  python bench/bench_functions.py [--warm 300] [--inputs 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import log, percentiles, verdict, write_results  # noqa: E402
from bench_cold_call import running_stack  # noqa: E402

from levers9 import App  # noqa: E402

TARGET_ADDED_P50_MS = 5.0
TARGET_MAP_PER_S = 500.0

app = App("bench-fn")


@app.function(cpu=0.25, memory="256Mi", keep_warm_seconds=600)
def inc(x):
    return x + 1


@app.function(cpu=0.5, memory="256Mi", keep_warm_seconds=600, max_containers=4, concurrency=8)
def double(x):
    return 2 * x


def timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        began = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - began) * 1000)
    return out


def warm(n: int) -> dict:
    from levers9.contracts.proto import functions_pb2 as pb
    from levers9.function_client import connect  # the SDK's own channel and token

    inc.remote(0)  # the sandbox is up from here on
    stub, target = connect()
    echo = timed(lambda i: stub.Echo(pb.EchoRequest(payload=b"x" * 32), metadata=target.metadata), n)
    remote = timed(inc.remote, n)
    local = timed(inc, n)
    doc = {"remote": percentiles(remote), "grpc_echo": percentiles(echo), "local": percentiles(local)}
    doc["added_over_echo_p50_ms"] = round(doc["remote"]["p50_ms"] - doc["grpc_echo"]["p50_ms"], 3)
    doc["added_over_local_p50_ms"] = round(doc["remote"]["p50_ms"] - doc["local"]["p50_ms"], 3)
    doc["verdict"] = verdict(doc["added_over_echo_p50_ms"], TARGET_ADDED_P50_MS, higher_is_better=False)
    return doc


def fan_out(inputs: int) -> dict:
    list(double.map(range(32)))  # up to 4 sandboxes started and warm
    began = time.perf_counter()
    results = list(double.map(range(inputs)))
    seconds = time.perf_counter() - began
    assert results == [2 * i for i in range(inputs)], "map returned wrong or out-of-order results"
    rate = inputs / seconds
    return {"inputs": inputs, "seconds": round(seconds, 3), "inputs_per_s": round(rate, 1),
            "verdict": verdict(rate, TARGET_MAP_PER_S)}


def cold(env: dict) -> dict:
    marker = f"cold-{time.time_ns()}"

    @app.function(cpu=0.25, memory="256Mi", env={"BENCH_MARK": marker})  # a new spec: no sandbox yet
    def fresh(x):
        return x

    since = datetime.utcnow().isoformat() + "Z"
    began = time.time()
    fresh.remote(1)
    ended = time.time()
    out = subprocess.run([sys.executable, "-m", "levers9", "events", "replay", "--since", since, "--json"],
                         env=env, capture_output=True, text=True, check=True).stdout
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    deployment = next(e["data"]["deployment_id"] for e in events if e["type"] == "DeploymentCreated")
    firsts: dict[str, float] = {}
    for e in events:
        if e["data"].get("deployment_id", deployment) == deployment or e["type"] in ("ContainerStarted",
                                                                                        "ContainerReady"):
            at = datetime.fromisoformat(e["occurred_at"].replace("Z", "+00:00")).timestamp()
            firsts.setdefault(e["type"], at)
    order = ["DeploymentCreated", "ContainerRequested", "ContainerScheduled", "ContainerStarted", "ContainerReady",
             "FunctionCallStarted", "FunctionCallFinished"]
    phases, last = {}, began
    for name in order:
        if name in firsts:
            phases[f"-> {name}"] = round((firsts[name] - last) * 1000, 1)
            last = firsts[name]
    phases["-> value in the caller"] = round((ended - last) * 1000, 1)
    return {"total_ms": round((ended - began) * 1000, 1), "phases_ms": phases}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--inputs", type=int, default=1000)
    args = parser.parse_args()
    with running_stack() as stack:
        os.environ["LEVERS9_HOME"] = str(stack.home)
        env = {**os.environ}
        log("cold call ...")
        doc = {"cold": cold(env)}
        log("warm calls ...")
        doc["warm"] = warm(args.warm)
        log("map ...")
        doc["map"] = fan_out(args.inputs)
    write_results("bench_functions", doc)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
