"""Benchmark: task queues through the whole stack.

Starts the stack (`levers9 up` in a temporary home), deploys the queue `btask` (returns x + 1;
max_containers 4, concurrency 32), warms it with one task, then:
1. enqueue: --tasks tasks POSTed to /taskqueue/btask by 64 concurrent clients: tasks/s accepted (202);
2. completed: from the first of those POSTs until the gateway lists them all succeeded: tasks/s done
   with 4 containers (the count is sampled every 0.2 s: the figure is within that of the truth);
2b. batch enqueue: --batch-tasks tasks POSTed to /taskqueue/btask/batch, --batch-size per request, by
   --batch-clients concurrent clients: tasks/s accepted (202), and tasks/s completed from the first
   batch until the gateway lists them all succeeded (the queue full from the start: the runners'
   own ceiling). Skipped (null) against a gateway without the batch route (a baseline of before);
3. enqueue -> start on a warm container: --latency tasks one at a time, each TaskStarted's time minus
   its TaskEnqueued's (both from the log's events), p50 and p99;
4. nothing lost: --killed tasks that each sleep 0.2 s, the worker SIGKILLed twice while they run
   (`levers9 up` starts it again each time); then every task must have succeeded, each with exactly
   one outcome event (TaskSucceeded/Failed/Expired/Cancelled), and how many ran more than once.

Targets (issue 24): enqueue >= 1,000 tasks/s (single puts and batches reported apart); >= 300 small
tasks/s completed with 4 containers; nothing lost over a run that SIGKILLs the worker twice.

  python bench/bench_tasks.py [--tasks 3000] [--batch-tasks 10000] [--latency 50] [--killed 300]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import log, percentiles, verdict, write_results  # noqa: E402
from bench_cold_call import running_stack  # noqa: E402

OUTCOMES = {"TaskSucceeded", "TaskFailed", "TaskExpired", "TaskCancelled"}
TARGET_ENQUEUE = 1000.0
TARGET_DONE = 300.0

APP = '''
import time
from levers9 import App

app = App("bench-tasks")


@app.task_queue(cpu=0.25, memory="128Mi", max_containers=4, concurrency=32, timeout=60, retries=0)
def btask(x, delay=0.0):
    if delay:
        time.sleep(delay)
    return x + 1
'''


async def put_many(url: str, token: str, n: int, clients: int = 64, delay: float = 0.0) -> tuple[list[str], float]:
    """n tasks POSTed by `clients` concurrent clients: their ids, and the seconds it took."""
    ids: list[str] = []
    todo = iter(range(n))
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {token}"},
                                     connector=aiohttp.TCPConnector(limit=0)) as s:
        async def client() -> None:
            for x in todo:
                async with s.post("/taskqueue/btask", json={"args": [x], "kwargs": {"delay": delay}}) as r:
                    assert r.status == 202, (r.status, await r.text())
                    ids.append((await r.json())["task_id"])
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return ids, time.perf_counter() - start


async def put_batches(url: str, token: str, n: int, size: int, clients: int) -> tuple[list[str], float] | None:
    """n tasks POSTed to /taskqueue/btask/batch, `size` per request, by `clients` concurrent clients:
    their ids and the seconds it took; None when the gateway has no batch route."""
    ids: list[str] = []
    todo = iter(range(0, n, size))
    missing = False
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {token}"},
                                     connector=aiohttp.TCPConnector(limit=0)) as s:
        async def client() -> None:
            nonlocal missing
            for first in todo:
                body = [{"args": [x]} for x in range(first, min(n, first + size))]
                async with s.post("/taskqueue/btask/batch", json=body) as r:
                    if r.status in (404, 405) and not ids:
                        missing = True
                        return
                    assert r.status == 202, (r.status, await r.text())
                    ids.extend((await r.json())["task_ids"])
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        took = time.perf_counter() - start
    return None if missing else (ids, took)


def count(stack, status: str) -> int:
    r = stack.http.get("/api/v1/tasks", params={"queue": "btask", "status": status, "limit": 1})
    r.raise_for_status()
    return int(r.json()["total"])


def wait_count(stack, status: str, n: int, timeout: float) -> float:
    """Seconds until `n` tasks of the queue have `status` (sampled every 0.2 s)."""
    start = time.monotonic()
    while count(stack, status) < n:
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"only {count(stack, status)} of {n} tasks {status} after {timeout:.0f} s")
        time.sleep(0.2)  # sampling the count
    return time.monotonic() - start


def task_events(stack, type_: str) -> list[dict]:
    """Every event of that type (all pages, newest first)."""
    out, before = [], ""
    while True:
        params = {"type": type_, "aggregate": "task", "limit": 1000, **({"before": before} if before else {})}
        r = stack.http.get("/api/v1/events", params=params)
        r.raise_for_status()
        out += r.json()
        before = r.headers.get("X-Next-Before", "")
        if not before:
            return out


def latency(stack, n: int) -> dict:
    """enqueue -> start of tasks put one at a time on a warm queue (from their events' times)."""
    gaps = []
    for x in range(n):
        task_id = stack.http.post("/taskqueue/btask", json={"args": [x]}).json()["task_id"]
        while stack.http.get(f"/api/v1/tasks/{task_id}").json()["status"] not in ("succeeded", "failed"):
            time.sleep(0.01)  # waiting for this task to end before the next
        at: dict[str, str] = {}
        while not {"TaskStarted", "TaskEnqueued"} <= set(at):  # the event list is projected a moment later
            events = stack.http.get("/api/v1/events", params={"aggregate": "task", "aggregate_id": task_id}).json()
            at = {e["type"]: e["occurred_at"] for e in events}
        gaps.append(seconds(at["TaskStarted"]) - seconds(at["TaskEnqueued"]))
    return percentiles([g * 1000 for g in gaps])


def seconds(iso: str) -> float:
    import datetime as dt
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def kill_twice(stack, ids_expected: int, base_done: int) -> dict:
    """Kill the worker twice while tasks run; then every task must succeed with one outcome."""
    from levers9.runtime.config import Settings
    from levers9.stack import Stack as Launcher

    launcher = Launcher(stack.home, Settings.load(stack.env))
    kills = 0
    for _ in range(2):
        while count(stack, "running") < 4:  # until some tasks run on the worker
            if count(stack, "succeeded") >= base_done + ids_expected:
                break  # all done before this kill (100 short tasks can end within a restart): none left to kill under
            time.sleep(0.05)
        else:
            launcher.kill_service("worker")
            stack.cli("up", timeout=300)  # starts what is not running
            kills += 1
    wait_count(stack, "succeeded", base_done + ids_expected, timeout=900)
    outcomes = collections.Counter()
    for t in OUTCOMES:
        for e in task_events(stack, t):
            outcomes[e["data"]["task_id"]] += 1
    started = collections.Counter(e["data"]["task_id"] for e in task_events(stack, "TaskStarted"))
    return {"worker_kills": kills, "outcomes_per_task": dict(collections.Counter(outcomes.values())),
            "tasks_with_an_outcome": len(outcomes),
            "ran_more_than_once": sum(1 for n in started.values() if n > 1),
            "failed": count(stack, "failed")}


def profile(py_spy: str, pid: int):
    import subprocess
    out = Path(__file__).resolve().parent / "results" / "tasks_gateway_profile.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    log(f"py-spy on the gateway (pid {pid}) -> {out}")
    return subprocess.Popen([py_spy, "record", "-p", str(pid), "-f", "raw", "-o", str(out), "-r", "50"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=3000)
    ap.add_argument("--batch-tasks", type=int, default=10_000)
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--batch-clients", type=int, default=4)
    ap.add_argument("--latency", type=int, default=50)
    ap.add_argument("--killed", type=int, default=300, help="0: no SIGKILL run")
    ap.add_argument("--profile", default="", help="py-spy binary: record the gateway while the tasks drain")
    ap.add_argument("--keep-home", action="store_true",
                    help="keep the stack's home (its logs: the gateway's task phases, task_timings.py)")
    args = ap.parse_args()
    log(f"load average before the stack: {os.getloadavg()}")
    with running_stack(keep_home=args.keep_home) as stack:
        stack.deploy(APP, "bench_tasks")
        ids, _ = asyncio.run(put_many(stack.gateway_url, stack.token, 1, clients=1))
        wait_count(stack, "succeeded", 1, timeout=300)
        began = time.monotonic()
        spy = profile(args.profile, stack.pid("gateway")) if args.profile else None
        ids, put_s = asyncio.run(put_many(stack.gateway_url, stack.token, args.tasks))
        enqueue_rate = len(ids) / put_s
        log(f"enqueued {len(ids)} tasks in {put_s:.2f} s: {enqueue_rate:.0f}/s")
        wait_count(stack, "succeeded", 1 + args.tasks, timeout=900)
        done_rate = args.tasks / (time.monotonic() - began)
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
        log(f"completed {args.tasks} tasks at {done_rate:.0f}/s")
        began = time.monotonic()
        batched = asyncio.run(put_batches(stack.gateway_url, stack.token, args.batch_tasks, args.batch_size,
                                          args.batch_clients)) if args.batch_tasks else None
        batch_rate = batch_done_rate = None
        if batched is not None:
            batch_rate = len(batched[0]) / batched[1]
            log(f"enqueued {len(batched[0])} tasks in batches of {args.batch_size} in {batched[1]:.2f} s: "
                f"{batch_rate:.0f}/s")
            wait_count(stack, "succeeded", 1 + args.tasks + args.batch_tasks, timeout=1800)
            batch_done_rate = args.batch_tasks / (time.monotonic() - began)
            log(f"completed the {args.batch_tasks} batched tasks at {batch_done_rate:.0f}/s")
        else:
            log("no batch route on this gateway: the batch step is skipped")
        lat = latency(stack, args.latency)
        log(f"enqueue -> start on a warm container: {lat}")
        base = 1 + args.tasks + (args.batch_tasks if batched is not None else 0) + args.latency
        lost: dict = {"skipped": True, "worker_kills": 0, "outcomes_per_task": {}, "failed": 0,
                      "tasks_with_an_outcome": 0}
        if args.killed:  # --killed 0: throughput only
            asyncio.run(put_many(stack.gateway_url, stack.token, args.killed, clients=8, delay=0.2))
            lost = kill_twice(stack, args.killed, base)
            log(f"two worker SIGKILLs under {args.killed} tasks: {lost}")
    doc = {"tasks": args.tasks, "enqueue_per_s": round(enqueue_rate, 1), "completed_per_s": round(done_rate, 1),
           "batch": {"tasks": args.batch_tasks, "size": args.batch_size, "clients": args.batch_clients,
                     "enqueue_per_s": batch_rate and round(batch_rate, 1),
                     "completed_per_s": batch_done_rate and round(batch_done_rate, 1)},
           "load_average": [round(x, 2) for x in os.getloadavg()],
           "enqueue_to_start": lat, "sigkill_run": {"tasks": args.killed, **lost},
           "verdicts": {"enqueue": verdict(enqueue_rate, TARGET_ENQUEUE), "completed": verdict(done_rate, TARGET_DONE),
                        "nothing_lost": "MET" if set(lost["outcomes_per_task"]) == {1} and lost["failed"] == 0
                        and lost["worker_kills"] == 2
                        and lost["tasks_with_an_outcome"] == base + args.killed else "MISSED"}}
    write_results("tasks", doc)


if __name__ == "__main__":
    main()
