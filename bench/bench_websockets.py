"""Benchmark: a WebSocket echo through the gateway vs straight to the container, same run.

Starts the whole stack (`levers9 up` in a temporary home, one local worker with the runc runtime),
deploys a raw ASGI echo app (concurrency 100, max_containers 1, keep_warm_seconds 600: one container,
each open WebSocket holding one of its slots), opens one WebSocket through the gateway to start it
(its address then comes from GET /api/v1/containers), then runs, for each path one after the other:

  direct    ws://<container address>/                 (the runner in the container)
  gateway   ws://<gateway>/endpoint/bench-ws + token  (auth, resolve, route, relay, runner)

1. latency: one connection, --messages round trips one at a time (send 32 bytes, read the echo):
   p50/p99, and the p50 the gateway adds;
2. throughput: --connections connections at once, each doing round trips one at a time for
   --seconds: messages/s (round trips, counted once) and their p50/p99.

The client is aiohttp in this one process (on the same 2 cores as everything else): it is the same
client for both paths, so the difference is the gateway's hop; the machine's load average before the
run is reported beside the figures.

  python bench/bench_websockets.py [--messages 2000] [--connections 50] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import log, percentiles, write_results  # noqa: E402
from bench_cold_call import running_stack  # noqa: E402

NAME = "bench-ws"
PAYLOAD = "x" * 32

APP = '''
from levers9 import App

app = App("bench-ws")


async def echo(scope, receive, send):
    await receive()
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", "text": message.get("text"), "bytes": message.get("bytes")})


app.asgi(echo, name="bench-ws", cpu=1.0, memory="256Mi", concurrency=100, max_containers=1,
         keep_warm_seconds=600, timeout=60)
'''


async def round_trips(ws: aiohttp.ClientWebSocketResponse, until: float, limit: int, out: list[float]) -> None:
    """Round trips one at a time until `until` (monotonic) or `limit` of them; each one's ms into `out`."""
    n = 0
    while n < limit and time.monotonic() < until:
        t0 = time.perf_counter()
        await ws.send_str(PAYLOAD)
        await ws.receive_str()
        out.append((time.perf_counter() - t0) * 1000)
        n += 1


async def run(url: str, headers: dict[str, str], connections: int, seconds: float, limit: int) -> dict:
    samples: list[float] = []
    async with aiohttp.ClientSession() as session:
        sockets = [await session.ws_connect(url, headers=headers) for _ in range(connections)]
        for ws in sockets:  # warm each connection once
            await ws.send_str(PAYLOAD)
            await ws.receive_str()
        began = time.monotonic()
        await asyncio.gather(*(round_trips(ws, began + seconds, limit, samples) for ws in sockets))
        wall = time.monotonic() - began
        for ws in sockets:
            await ws.close()
    return {"connections": connections, "messages": len(samples), "seconds": round(wall, 2),
            "messages_per_s": round(len(samples) / wall, 1), **percentiles(samples)}


async def measure(direct: str, gateway: str, token: str, args: argparse.Namespace) -> dict:
    auth = {"Authorization": f"Bearer {token}"}
    targets = {"direct": (direct, {}), "gateway": (gateway, auth)}
    results: dict[str, dict] = {}
    for target, (url, headers) in targets.items():
        await run(url, headers, 10, 1.0, 10**9)  # warm-up
        one = await run(url, headers, 1, 600.0, args.messages)
        many = await run(url, headers, args.connections, args.seconds, 10**9)
        results[target] = {"one_connection": one, "concurrent": many}
        log(f"{target:>7}: 1 connection p50 {one['p50_ms']:.2f} ms p99 {one['p99_ms']:.2f} ms; {args.connections} "
            f"connections {many['messages_per_s']:.0f} msg/s p50 {many['p50_ms']:.2f} ms p99 {many['p99_ms']:.2f} ms")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with running_stack() as stack:
        stack.deploy(APP, "bench_ws")
        gateway = stack.gateway_url.replace("http", "ws", 1) + f"/endpoint/{NAME}"

        async def start() -> None:  # the first connection waits while the container starts
            async with aiohttp.ClientSession() as s, s.ws_connect(
                    gateway, headers={"Authorization": f"Bearer {stack.token}"}) as ws:
                await ws.send_str(PAYLOAD)
                await ws.receive_str()
        asyncio.run(start())
        [live] = [c for c in stack.containers(NAME) if c["status"] == "ready"]
        direct = live["address"].replace("http", "ws", 1) + "/"
        log(f"container {live['container_id']} at {live['address']}; load average before {load_before}")
        results = asyncio.run(measure(direct, gateway, stack.token, args))
    d, g = results["direct"], results["gateway"]
    summary = {
        "added_p50_ms_one_connection": round(g["one_connection"]["p50_ms"] - d["one_connection"]["p50_ms"], 3),
        "added_p50_ms_concurrent": round(g["concurrent"]["p50_ms"] - d["concurrent"]["p50_ms"], 3),
        "gateway_pct_of_direct_messages_per_s": round(100 * g["concurrent"]["messages_per_s"]
                                                      / max(1e-9, d["concurrent"]["messages_per_s"]), 1),
    }
    log(f"summary: {summary}")
    path = write_results("websockets", {"args": vars(args), "load_average_before": load_before,
                                        "load_average_after": os.getloadavg(), "results": results,
                                        "summary": summary})
    log(f"results in {path}")


if __name__ == "__main__":
    main()
