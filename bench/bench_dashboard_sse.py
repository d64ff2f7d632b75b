"""Benchmark: an appended event reaching N browsers' `/events` streams through the dashboard.

  python bench/bench_dashboard_sse.py [--clients 20] [--rate 200] [--seconds 20]      (a FAKE gateway)
  python bench/bench_dashboard_sse.py --stack [...]                 (the running `levers9 up` stack)

--stack (the figure the issue asks for): the stack of $LEVERS9_HOME (`levers9 up` first). Events are
appended to the log (JetStream, as the admin) at --rate per second, open loop, for --seconds:
ContainerCheckpointRequested of made-up container ids in workspace `default` (no worker owns them,
so nothing acts on them; the gateway indexes and streams them). The path measured is the whole
one: publish -> JetStream -> the gateway's ordered consumer -> its SSE stream -> the dashboard's hub
-> N client streams; latency = the client's receipt - the publish call's start, by event id.

Without --stack: the FAKE gateway of tests/fakes (in this process) appends and streams; the
dashboard is its own process (`levers9 service dashboard`) either way, so its CPU is its own:
CPU s / wall s of the dashboard's process while streaming, with 1 client and with N (the
difference / (N-1) is the CPU one more client costs). Target: p99 <= 250 ms at 200 events/s, 20 clients.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _common import cpu_seconds, log, percentiles, verdict, write_results  # noqa: E402


class Clients:
    """N /events readers in a process of their own (so parsing 20 streams never delays the appends
    nor the other way round); receipt times (time.time(), one clock on one machine) by event id."""

    def __init__(self, url: str, token: str, n: int) -> None:
        self.url, self.token, self.n = url, token, n
        self.received: dict[str, list[float]] = {}
        self.out = Path(tempfile.mkstemp(prefix="levers9-bench-sse-", suffix=".json")[1])

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--readers", self.url, self.token, str(self.n), str(self.out),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)  # "open" once all N are connected
        assert line.strip() == b"open", line

    async def stop(self) -> None:
        self.proc.stdin.close()  # the readers' signal to write what they saw and exit
        await asyncio.wait_for(self.proc.wait(), 60)
        self.received = json.loads(self.out.read_text())
        self.out.unlink()


async def read_stream(url: str, token: str, on_id) -> None:
    """One /events reader on a plain socket: HTTP/1.1 by hand, the chunked body decoded, and each `data:`
    line's envelope id handed to `on_id` — a browser does this in native code, and httpx's line iterator
    in Python cost more CPU than the dashboard itself at 20 x 200 events/s, which the figure then measured."""
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    writer.write(f"GET /events HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
                 f"Accept: text/event-stream\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    assert b"chunked" in head.lower(), head[:400]
    on_id(None)  # connected
    partial = b""
    try:
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            data = await reader.readexactly(size + 2)  # the chunk and its CRLF
            lines = (partial + data[:-2]).split(b"\n")
            partial = lines.pop()
            for line in lines:
                if line.startswith(b"data: "):
                    at = line.find(b'"id": "')
                    at = at + 7 if at >= 0 else line.find(b'"id":"') + 6
                    on_id(line[at:line.find(b'"', at)].decode())
    finally:
        writer.close()


async def readers(url: str, token: str, n: int, out: Path) -> None:
    received: dict[str, list[float]] = {}
    opened = asyncio.Event()
    count = [0]

    def on_id(event_id: str | None) -> None:
        if event_id is None:
            count[0] += 1
            if count[0] == n:
                opened.set()
        else:
            received.setdefault(event_id, []).append(time.time())

    tasks = [asyncio.create_task(read_stream(url, token, on_id)) for _ in range(n)]
    await asyncio.wait_for(opened.wait(), 30)
    sys.stdout.write("open\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    out.write_text(json.dumps(received))


async def start_dashboard(gateway_url: str, home: Path) -> tuple[subprocess.Popen, str]:
    from levers9.runtime.ports import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    env.update(LEVERS9_HOME=str(home), LEVERS9_GATEWAY_URL=gateway_url, LEVERS9_HTTP_PORT=str(port),
               LEVERS9_SERVICE="dashboard", LEVERS9_LOG_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-m", "levers9", "service", "dashboard"], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(home / "dashboard.log", "wb"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient(trust_env=False) as c:
        while time.monotonic() < deadline:
            try:
                if (await c.get(f"{url}/healthz", timeout=5)).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)  # polling its /healthz until it answers
    raise RuntimeError(f"the dashboard did not start; see {home / 'dashboard.log'}")


async def offer(append, rate: float, seconds: float) -> dict[str, float]:
    """Call `append()` (returns the event id) at `rate`/s, open loop; publish times by id."""
    sent: dict[str, float] = {}

    async def one() -> None:
        t = time.time()
        sent[await append()] = t

    start = time.perf_counter()
    pending = []
    for i in range(int(rate * seconds)):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing the offered load
        pending.append(asyncio.create_task(one()))  # never waiting for an ack before the next
    await asyncio.gather(*pending)
    return sent


async def run_phase(url: str, token: str, pid: int, n: int, append, rate: float, seconds: float) -> dict:
    clients = Clients(url, token, n)
    await clients.start()
    await asyncio.sleep(0.5)  # the hub's upstream connects after the first client
    cpu0, wall0 = cpu_seconds(pid), time.perf_counter()
    sent = await offer(append, rate, seconds)
    offered_s = time.perf_counter() - wall0
    await asyncio.sleep(2)  # the stragglers: the latency target is far below this
    cpu, wall = cpu_seconds(pid) - cpu0, time.perf_counter() - wall0
    await clients.stop()
    lat = [(t - sent[i]) * 1000 for i in sent for t in clients.received.get(i, [])]
    missing = n * len(sent) - len(lat)
    return {"clients": n, "events": len(sent), "offered_s": round(offered_s, 2), "deliveries": len(lat), "missing": missing,
            "latency": percentiles(lat), "dashboard_cpu_s": round(cpu, 3), "wall_s": round(wall, 2),
            "dashboard_cpu_pct_of_a_core": round(100 * cpu / wall, 2)}


async def fake_mode(args) -> dict:
    from fakes.fake_gateway import FakeGateway, serving

    gw = FakeGateway()
    async with serving(gw.app) as gateway_url:
        with tempfile.TemporaryDirectory(prefix="levers9-bench-dash-") as tmp:
            proc, url = await start_dashboard(gateway_url, Path(tmp))
            try:
                async def append() -> str:
                    ev = await gw.append("ws-a", "ContainerCheckpointRequested", "container", str(uuid.uuid4()))
                    return ev["id"]

                one = await run_phase(url, "tok-a", proc.pid, 1, append, args.rate, args.seconds)
                many = await run_phase(url, "tok-a", proc.pid, args.clients, append, args.rate, args.seconds)
            finally:
                proc.terminate()
                proc.wait(10)
    return {"gateway": "fake (tests/fakes, in the benchmark's process)", "one_client": one, "n_clients": many}


async def stack_mode(args) -> dict:
    from levers9.contracts import envelope
    from levers9.contracts import events as E
    from levers9.runtime.bus import Bus
    from levers9.runtime.bus_auth import BusAuth
    from levers9.runtime.config import Settings

    s = Settings.load()
    state = json.loads((s.home_path / "state.json").read_text())["components"]
    url, pid = state["dashboard"]["url"], state["dashboard"]["pid"]
    bus = await Bus.connect(state["nats"]["url"], name="bench-dashboard", auth=BusAuth.from_settings(s))
    try:
        async def append() -> str:
            env = envelope(E.ContainerCheckpointRequested(container_id=f"bench-{uuid.uuid4()}"), workspace="default")
            await bus.publish(env)
            return env.id

        one = await run_phase(url, s.client.token, pid, 1, append, args.rate, args.seconds)
        many = await run_phase(url, s.client.token, pid, args.clients, append, args.rate, args.seconds)
    finally:
        await bus.close()
    return {"gateway": f"the levers9 up stack of {s.home_path} (real NATS, gateway, dashboard)", "one_client": one,
            "n_clients": many}


def main() -> None:
    if sys.argv[1:2] == ["--readers"]:
        url, token, n, out = sys.argv[2:6]
        asyncio.run(readers(url, token, int(n), Path(out)))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rate", type=float, default=200)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--stack", action="store_true", help="the running stack of $LEVERS9_HOME")
    args = p.parse_args()
    doc = asyncio.run(stack_mode(args) if args.stack else fake_mode(args))
    one, many = doc["one_client"], doc["n_clients"]
    per_client = (many["dashboard_cpu_pct_of_a_core"] - one["dashboard_cpu_pct_of_a_core"]) / max(1, args.clients - 1)
    doc.update(rate=args.rate, seconds=args.seconds, cpu_pct_per_extra_client=round(per_client, 3),
               verdict=verdict(many["latency"].get("p99_ms", 1e9), 250, higher_is_better=False))
    write_results("dashboard_sse" + ("_stack" if args.stack else ""), doc)
    log(f"{args.clients} clients at {args.rate:.0f} events/s: p50 {many['latency'].get('p50_ms')} ms, "
        f"p99 {many['latency'].get('p99_ms')} ms, missing {many['missing']}; dashboard CPU "
        f"{many['dashboard_cpu_pct_of_a_core']} % of a core ({one['dashboard_cpu_pct_of_a_core']} % with one client: "
        f"{per_client:.2f} % per extra client) -> {doc['verdict']}")


if __name__ == "__main__":
    main()
