"""Benchmark: the first answer of the overview and of the event log through the dashboard, with
10,000 containers and 100,000 events in the history.

  python bench/bench_dashboard_render.py                 (a FAKE gateway holding that history)
  python bench/bench_dashboard_render.py --stack         (the running `levers9 up` stack of $LEVERS9_HOME)

--stack appends the history to the real log as the admin, in workspace `default`: --containers
ContainerRequested in a pool no worker serves (`bench-nowhere`: the scheduler defers each, which
appends PlacementDeferred), then ContainerFailed for all but --live of them, then made-up
ContainerCheckpointRequested until --events were appended in all; it waits until the gateway has
projected them (its container count and its newest event), then measures.

Measured, each as a browser's first visit does it (a new sign-in, so nothing is cached): the time to
the whole body of `GET /api/overview` (deployments, containers by state, workers and pools, the last
20 failures: five gateway reads at once) and of `GET /api/v1/events?limit=100` (the event log's first
page), --repeat times each; the data the pages draw (the browser's own drawing is not in it).
Target: <= 1.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _common import log, percentiles, verdict, write_results  # noqa: E402
from bench_dashboard_sse import start_dashboard  # noqa: E402


async def first_answers(url: str, token: str, repeat: int) -> dict:
    out: dict[str, list[float]] = {"overview": [], "event_log": []}
    sizes: dict[str, int] = {}
    for _ in range(repeat):
        async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=60) as c:
            r = await c.post("/api/session/tickets", headers={"Authorization": f"Bearer {token}"})
            assert (await c.get(r.json()["url"])).status_code == 303
            for name, path in (("overview", "/api/overview"), ("event_log", "/api/v1/events?limit=100")):
                t = time.perf_counter()
                r = await c.get(path)
                body = await r.aread()
                out[name].append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, body[:300]
                sizes[name] = len(body)
    return {name: {**percentiles(v), "first_ms": round(v[0], 1), "bytes": sizes[name]} for name, v in out.items()}


async def fake_mode(args) -> dict:
    from fakes.fake_gateway import FakeGateway, now_iso, serving

    gw = FakeGateway()
    for i in range(args.containers):
        gw.containers[f"c{i}"] = {"workspace": "ws-a", "container_id": f"c{i}", "status": "ready" if i < args.live else "stopped",
                                  "correlation_id": f"k{i}", "request": {"spec": {"image": "x" * 200}}}
    gw.add_bulk([{"type": "ContainerFailed" if i % 50 == 0 else "ContainerStarted", "version": 1, "occurred_at": now_iso(i),
                  "workspace": "ws-a", "aggregate": "container", "aggregate_id": f"c{i % args.containers}",
                  "correlation_id": f"k{i % args.containers}", "causation_id": "", "data": {"reason": "bench"}}
                 for i in range(args.events)])
    gw.deployments.append({"workspace": "ws-a", "name": "hello", "version": 1, "status": "active"})
    async with serving(gw.app) as gateway_url:
        with tempfile.TemporaryDirectory(prefix="levers9-bench-render-") as tmp:
            proc, url = await start_dashboard(gateway_url, Path(tmp))
            try:
                return {"gateway": "fake (tests/fakes: answers from memory, scans its list per request)",
                        **await first_answers(url, "tok-a", args.repeat)}
            finally:
                proc.terminate()
                proc.wait(10)


async def stack_mode(args) -> dict:
    from levers9.contracts import envelope
    from levers9.contracts import events as E
    from levers9.runtime.bus import Bus
    from levers9.runtime.bus_auth import BusAuth
    from levers9.runtime.config import Settings

    s = Settings.load()
    state = json.loads((s.home_path / "state.json").read_text())["components"]
    gateway, url = state["gateway"]["url"], state["dashboard"]["url"]
    auth = {"Authorization": f"Bearer {s.client.token}"}
    bus = await Bus.connect(state["nats"]["url"], name="bench-render", auth=BusAuth.from_settings(s))
    t0 = time.perf_counter()
    ids = [f"bench-{uuid.uuid4()}" for _ in range(args.containers)]
    async def publish_all(events: list) -> list:
        out = []
        for i in range(0, len(events), 500):  # 500 in flight at a time: acks awaited per batch
            out += await asyncio.gather(*(bus.publish(envelope(e, workspace="default")) for e in events[i:i + 500]))
        return out

    try:
        await publish_all([E.ContainerRequested(container_id=cid, pool="bench-nowhere", reason="bench") for cid in ids])
        await publish_all([E.ContainerFailed(container_id=cid, reason="bench: never placed") for cid in ids[args.live:]])
        sent = 2 * len(ids) - args.live + len(ids)  # and the scheduler's PlacementDeferred, one per request
        acks = await publish_all([E.ContainerCheckpointRequested(container_id=f"bench-{uuid.uuid4()}")
                                  for _ in range(max(0, args.events - sent))])
        last = acks[-1] if acks else None
    finally:
        await bus.close()
    log(f"appended the history in {time.perf_counter() - t0:.1f} s; waiting for the gateway's projections")
    async with httpx.AsyncClient(trust_env=False, timeout=30, headers=auth) as c:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            total = int((await c.get(f"{gateway}/api/v1/containers", params={"all": "true", "limit": 1})).headers.get("x-total-count", 0))
            newest = (await c.get(f"{gateway}/api/v1/events", params={"limit": 1})).json()
            if total >= args.containers and newest and (last is None or newest[0]["seq"] >= last.seq):
                break
            await asyncio.sleep(1)  # polling the projections until they hold the history
    log(f"projected after {time.perf_counter() - t0:.1f} s")
    return {"gateway": f"the levers9 up stack of {s.home_path}", **await first_answers(url, s.client.token, args.repeat)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--containers", type=int, default=10_000)
    p.add_argument("--live", type=int, default=1_000, help="containers left live (the rest ended)")
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--stack", action="store_true")
    args = p.parse_args()
    doc = asyncio.run(stack_mode(args) if args.stack else fake_mode(args))
    worst = max(doc["overview"]["first_ms"], doc["event_log"]["first_ms"], doc["overview"]["max_ms"], doc["event_log"]["max_ms"])
    doc.update(containers=args.containers, live=args.live, events=args.events, verdict=verdict(worst, 1500, higher_is_better=False))
    write_results("dashboard_render" + ("_stack" if args.stack else ""), doc)
    log(f"overview: first {doc['overview']['first_ms']} ms, p50 {doc['overview']['p50_ms']} ms ({doc['overview']['bytes']} B); "
        f"event log: first {doc['event_log']['first_ms']} ms, p50 {doc['event_log']['p50_ms']} ms -> {doc['verdict']}")


if __name__ == "__main__":
    main()
