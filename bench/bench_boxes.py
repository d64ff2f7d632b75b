"""Benchmark: a box whose program takes 3 s before it answers, started cold and restored (issue 25).

Starts the stack (`levers9 up` in a temporary home, one local worker with the runc runtime) and
deploys --boxes boxes of one app, each `python3 -c` a program that sleeps 3 s (a server loading a
model or warming a cache stands for it) and then serves HTTP (http.server), checkpoint_enabled,
keep_warm_seconds 2. Then:

  cold      each box's first call: request sent -> answer (no checkpoint yet: the container starts
            the program, which answers after its 3 s; the worker dumps it once its port answers)
  restored  --restores times per box, in turn: wait until its checkpoint is stored and no container
            of it is live (scaled in), then call it: the new container restores that checkpoint
            (each one's `restored_from` is checked)

The figure is p50 cold / p50 restored. Target (issue 25): restored start >= 5x faster than cold.

  python bench/bench_boxes.py [--boxes 3] [--restores 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import log, percentiles, verdict, write_results  # noqa: E402
from bench_cold_call import Stack, running_stack  # noqa: E402

TARGET_SPEEDUP = 5.0
PORT = 8124
PROGRAM = ("import time, http.server as h; time.sleep(3); "
           f"h.ThreadingHTTPServer(('0.0.0.0', {PORT}), h.SimpleHTTPRequestHandler).serve_forever()")
APP = '''
from levers9 import App

app = App("bench-boxes")
for i in range(BOXES):
    app.box(f"slowbox-{i}", command=["python3", "-c", PROGRAM], port=PORT, cpu=0.5, memory="256Mi",
            keep_warm_seconds=2, checkpoint_enabled=True, timeout=120)
'''


def call(stack: Stack, name: str) -> tuple[float, str]:
    """(ms from request to answer, the container that answered)."""
    began = time.perf_counter()
    r = stack.http.get(f"/box/{name}/")
    ms = (time.perf_counter() - began) * 1000
    if r.status_code != 200:
        raise RuntimeError(f"/box/{name}/ answered {r.status_code}: {r.text[:300]}")
    return ms, r.headers["x-levers9-container-id"]


def stored_checkpoint(stack: Stack, container_id: str, timeout: float = 120) -> str:
    """The id of the checkpoint dumped from `container_id`, once it is stored."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = stack.http.get("/api/v1/checkpoints", params={"all": "true"})
        r.raise_for_status()
        for c in r.json():
            if c["container_id"] == container_id and c["status"] == "available":
                return c["checkpoint_id"]
        time.sleep(0.2)
    raise RuntimeError(f"no checkpoint of {container_id} was stored within {timeout:.0f} s")


def restored_call(stack: Stack, name: str, checkpoint_id: str) -> float:
    stack.wait_no_live(name, timeout=120)
    ms, cid = call(stack, name)
    [row] = [c for c in stack.containers(name, all=True) if c["container_id"] == cid]
    if row.get("restored_from") != checkpoint_id:
        raise RuntimeError(f"{name}'s container {cid} did not restore {checkpoint_id}: {row.get('note')!r}")
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boxes", type=int, default=3)
    ap.add_argument("--restores", type=int, default=3, help="restored calls per box")
    args = ap.parse_args()
    load_before = os.getloadavg()
    with running_stack() as stack:
        names = [f"slowbox-{i}" for i in range(args.boxes)]
        stack.deploy(APP.replace("BOXES", str(args.boxes)).replace("PROGRAM", repr(PROGRAM))
                     .replace("PORT", str(PORT)), "bench_boxes")
        cold, dumped = [], {}
        for name in names:
            ms, cid = call(stack, name)
            cold.append(ms)
            dumped[name] = stored_checkpoint(stack, cid)
            log(f"{name}: cold {ms:.0f} ms; checkpoint {dumped[name]} stored")
        restored = []
        for _ in range(args.restores):
            for name in names:
                restored.append(restored_call(stack, name, dumped[name]))
                log(f"{name}: restored {restored[-1]:.0f} ms")
    speedup = percentiles(cold)["p50_ms"] / percentiles(restored)["p50_ms"]
    doc = {"cold": percentiles(cold), "restored": percentiles(restored), "speedup": round(speedup, 1),
           "verdict": verdict(speedup, TARGET_SPEEDUP),
           "load_average": {"before": [round(x, 2) for x in load_before],
                            "after": [round(x, 2) for x in os.getloadavg()]}}
    write_results("bench_boxes", doc)
    log(f"cold p50 {doc['cold']['p50_ms']:.0f} ms, restored p50 {doc['restored']['p50_ms']:.0f} ms: "
        f"{speedup:.1f}x (target >= {TARGET_SPEEDUP:g}x): {doc['verdict']}")


if __name__ == "__main__":
    main()
