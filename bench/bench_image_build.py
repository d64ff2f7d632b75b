"""Benchmark: image builds through the platform — a first build, a rebuild after changing the last
line of the blueprint, and a cached image.

Starts the whole stack (`levers9 up` in a temporary home: NATS, Postgres, S3, the registry, the six
services, a default worker and a build worker), then asks the gateway for a blueprint with a few
packages and a command (`POST /api/v1/images`) and waits for ImageBuilt (`GET /api/v1/images/ID`):

  first     nothing cached but the platform's base (pushed once per stack before the timing: the
            base push is reported apart, it is a once-per-registry cost)
  rebuild   the same blueprint with its last command changed: every step before it is reused
  cached    the first blueprint again: the image exists, the answer is immediate

Each figure is from the request to ImageBuilt as the client sees it; the build's own phases
(steps, push, archive to S3) come from its events.

  python bench/bench_image_build.py [--packages humanize==4.9.0,tabulate==0.9.0,six==1.16.0] [--keep-home]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import log, write_results  # noqa: E402
from bench_cold_call import running_stack  # noqa: E402


def blueprint(packages: list[str], last: str) -> dict:
    return {"python_packages": packages, "commands": ["mkdir -p /srv/bench && echo one > /srv/bench/a", last],
            "env": {"BENCH": "1"}}


def build(stack, image: dict, timeout: float = 1800) -> dict:
    """POST the blueprint, then poll the image until it is built; the client-side seconds and the
    image's detail (steps with their states and seconds)."""
    started = time.perf_counter()
    r = stack.http.post("/api/v1/images", json={"blueprint": image, "requested_by": "bench"}, timeout=60)
    r.raise_for_status()
    answer = r.json()
    image_id = answer["image_id"]
    while True:
        detail = stack.http.get(f"/api/v1/images/{image_id}", timeout=30).json()
        if detail["status"] in ("built", "failed"):
            break
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"{image_id} not built in {timeout} s: {detail}")
        time.sleep(0.1)
    seconds = time.perf_counter() - started
    if detail["status"] != "built":
        raise RuntimeError(f"{image_id} failed: {detail.get('reason')}\n" + "\n".join(detail.get("log_tail", [])))
    return {"image_id": image_id, "seconds": round(seconds, 2), "first_answer": answer.get("status"),
            "steps": [{"text": s.get("text", ""), "state": s.get("state", ""), "seconds": s.get("seconds", 0)}
                      for s in detail.get("steps", [])],
            "size_bytes": detail.get("size_bytes", 0), "build_seconds": detail.get("seconds", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packages", default="humanize==4.9.0,tabulate==0.9.0,six==1.16.0")
    ap.add_argument("--keep-home", action="store_true")
    args = ap.parse_args()
    packages = args.packages.split(",")
    with running_stack(args.keep_home) as stack:
        # the base goes to the registry once per registry: a one-step blueprint pays it, apart
        base = build(stack, {"commands": ["true"]})
        log(f"base pushed and a one-command image built in {base['seconds']} s")
        first = build(stack, blueprint(packages, "echo first > /srv/bench/b"))
        rebuild = build(stack, blueprint(packages, "echo second > /srv/bench/b"))
        cached = build(stack, blueprint(packages, "echo first > /srv/bench/b"))
    rows = {"base_and_one_command": base, "first": first, "rebuild_last_line": rebuild, "cached": cached}
    for name, row in rows.items():
        states = ", ".join(f"{s['state']}" for s in row["steps"])
        log(f"{name:22} {row['seconds']:7.2f} s  ({row['first_answer']}; steps: {states})")
    write_results("image_build", {"packages": packages, **rows})


if __name__ == "__main__":
    main()
