"""A publisher in its own process, as in production (the gateway publishes, the scheduler projects).

Modes:
  max    publish --events ContainerRequested as fast as NATS acks them (publish_async, a window of acks
         in flight), generating the envelopes as it goes.
  paced  open-loop load of --rate events/s for --seconds with `Bus.publish` (one request/ack round trip
         each, the library's own path): each publish is started at its scheduled time whether or not
         earlier ones have returned, so a slow moment cannot hide latency (no coordinated omission).

It writes a JSON document to --out: when it started and ended (time.monotonic, which is the same
clock in every process on Linux, so the consumer's timestamps can be compared with it), and in paced
mode [envelope id, time of the publish call, time of the ack, stream sequence] per event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import publish_many  # noqa: E402

from levers9.contracts import envelope  # noqa: E402
from levers9.contracts import events as E  # noqa: E402
from levers9.contracts.spec import Code, DeploymentSpec, Resources  # noqa: E402
from levers9.runtime.bus import Bus  # noqa: E402

RESOURCES = Resources(cpu_millicores=500, memory_mib=512)
SPECS = [DeploymentSpec(name=f"d{d:03d}", code=Code(module="app", handler="handler"), resources=RESOURCES)
         for d in range(50)]


def make(i: int, ids: int, workspace: str):
    """A ContainerRequested as the gateway appends it: the deployment's spec travels with it."""
    return envelope(E.ContainerRequested(container_id=f"c{i % ids:05d}", deployment_id=f"d{i % 50:03d}",
                                         deployment_version=1, resources=RESOURCES, spec=SPECS[i % 50]),
                    workspace=workspace)


async def max_rate(bus: Bus, events: int, ids: int, workspace: str, chunk: int = 5000) -> dict:
    t0 = time.monotonic()
    last = 0
    for start in range(0, events, chunk):
        envs = [make(i, ids, workspace) for i in range(start, min(events, start + chunk))]
        seqs = await publish_many(bus, envs)
        last = max(last, max(seqs))
    t1 = time.monotonic()
    return {"t_start": t0, "t_end": t1, "events": events, "last_seq": last,
            "publish_rate": round(events / (t1 - t0), 1)}


async def paced(bus: Bus, rate: float, seconds: float, ids: int, workspace: str) -> dict:
    n = int(rate * seconds)
    records: list[list] = [None] * n  # type: ignore[list-item]
    envs = [make(i, ids, workspace) for i in range(n)]  # made ahead: the pacing loop only publishes
    tasks = []

    async def one(i: int) -> None:
        env = envs[i]
        t_call = time.monotonic()
        ack = await bus.publish(env)
        records[i] = [env.id, t_call, time.monotonic(), ack.seq]

    t0 = time.monotonic() + 0.05
    behind = 0.0
    for i in range(n):
        due = t0 + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            behind = max(behind, -delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    t1 = time.monotonic()
    return {"t_start": t0, "t_end": t1, "events": n, "offered_rate": rate,
            "achieved_rate": round(n / (max(r[1] for r in records) - t0), 1),
            "max_schedule_slip_ms": round(behind * 1000, 3), "records": records}


async def main(args: argparse.Namespace) -> None:
    bus = await Bus.connect(args.nats_url, name="levers9-bench-publisher")
    try:
        if args.mode == "max":
            doc = await max_rate(bus, args.events, args.ids, args.workspace)
        else:
            doc = await paced(bus, args.rate, args.seconds, args.ids, args.workspace)
    finally:
        await bus.close()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    doc["cpu_s"] = round(ru.ru_utime + ru.ru_stime, 3)
    Path(args.out).write_text(json.dumps(doc))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--nats-url", required=True)
    p.add_argument("--mode", choices=("max", "paced"), required=True)
    p.add_argument("--events", type=int, default=50_000)
    p.add_argument("--rate", type=float, default=1000)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--ids", type=int, default=5000)
    p.add_argument("--workspace", default="bench")
    p.add_argument("--out", required=True)
    asyncio.run(main(p.parse_args()))
