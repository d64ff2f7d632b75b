"""SIMULATED workers for bench_hosts.py's `placement` part: the control plane of many hosts, no containers.

A simulated worker speaks to the stack exactly as a real worker's control path does, and nothing else:
- it connects to the stack's NATS as ITS OWN worker user (`Issuer.worker_creds`: the permissions the
  pool controller gives a real worker), signs its power events with the workers' signing key and its
  container reports with its own user key (`Reporter`), like `levers9 service worker`;
- it registers (WorkerRegistered with a made-up capacity, then WorkerReady) and beats in the
  heartbeat KV every 2 s, so the pool controller keeps it alive;
- its durable consumer `worker-<id>` takes every ContainerScheduled (the real worker's filter) and,
  for one placed on it, answers ContainerStarted then ContainerReady with a dummy address
  `http://<its host address>:<port>`: NO container runs, nothing listens there.

So the figures it helps make are the platform's (gateway, scheduler, projections, NATS), not a
container's. With `hosts.add_host` each one runs in its own network namespace (`nsenter --net`),
talking to NATS over the underlay like a `netns` pool's worker.

  python bench/sim_workers.py --home H --worker-id sim-1 --pool sim --nats-url URL --address 10.210.0.2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from levers9.contracts import SYSTEM_WORKSPACE, envelope, subjects
from levers9.contracts import events as E

HEARTBEAT_EVERY_S = 2.0  # as services/worker/service.py
PORT_BASE = 30000  # the dummy published ports of its "containers"


@dataclass(frozen=True)
class SimConfig:
    home: Path
    worker_id: str
    pool: str
    nats_url: str
    address: str  # its host address (the underlay's, or 127.0.0.1 in the root namespace)
    cpu_millicores: int
    memory_mib: int


@dataclass
class SimState:
    answered: int = 0
    others: int = 0  # placements on other workers it saw (and acked), as every real worker does
    first_at: float = 0.0
    last_at: float = 0.0
    ports: dict[str, int] = field(default_factory=dict)


def bus_auth(home: Path, worker_id: str):  # -> BusAuth
    """This worker's own NATS user (minted now, as the pool controller mints one per worker), the
    workers' signing key for its power events, its user key for its reports."""
    from levers9.runtime.bus_auth import BusAuth
    from levers9.runtime.bus_signing import Reporter, Signer, Verifier
    from levers9.runtime.nats_issuer import Issuer

    issuer = Issuer(home / "nats" / "auth")
    creds = issuer.worker_creds(worker_id)
    return BusAuth(creds=str(creds), signer=Signer.load(issuer.signing_path("worker")),
                   verifier=Verifier.load(issuer.signers_path), reporter=Reporter.from_creds(creds))


async def register(bus, cfg: SimConfig) -> None:
    registered = E.WorkerRegistered(worker_id=cfg.worker_id, pool=cfg.pool, cpu_millicores=cfg.cpu_millicores,
                                    memory_mib=cfg.memory_mib, features=["simulated"],
                                    address=f"http://{cfg.address}:{PORT_BASE - 1}")
    env = envelope(registered, workspace=SYSTEM_WORKSPACE)
    await bus.publish(env)
    await bus.publish(envelope(E.WorkerReady(worker_id=cfg.worker_id), workspace=SYSTEM_WORKSPACE,
                               correlation_id=env.correlation_id, causation_id=env.id))


async def heartbeat(bus, cfg: SimConfig, state: SimState, stop: asyncio.Event) -> None:
    kv = await bus.heartbeats()
    while not stop.is_set():
        try:
            await kv.put(cfg.worker_id, json.dumps({"at": time.time(), "pid": os.getpid(),
                                                    "containers": len(state.ports)}).encode())
        except Exception as exc:  # noqa: BLE001 - NATS busy or reconnecting: the next beat retries
            print(f"{cfg.worker_id}: heartbeat failed: {exc}", file=sys.stderr, flush=True)
        try:
            await asyncio.wait_for(stop.wait(), HEARTBEAT_EVERY_S)
        except asyncio.TimeoutError:
            pass


def answer_handler(bus, cfg: SimConfig, state: SimState):
    """The consumer's handler: Started + Ready for a placement on this worker, nothing for others."""

    async def handle(d) -> None:
        ev = d.message.event
        if not isinstance(ev, E.ContainerScheduled):
            return
        if ev.worker_id != cfg.worker_id:
            state.others += 1
            return
        if ev.container_id in state.ports:  # redelivered: answered already
            return
        port = state.ports[ev.container_id] = PORT_BASE + len(state.ports)
        env = d.message.envelope
        for event in (E.ContainerStarted(container_id=ev.container_id, worker_id=cfg.worker_id, note="simulated"),
                      E.ContainerReady(container_id=ev.container_id, worker_id=cfg.worker_id,
                                       address=f"http://{cfg.address}:{port}")):
            await bus.publish(envelope(event, workspace=env.workspace, correlation_id=env.correlation_id))
        state.answered += 1
        state.first_at = state.first_at or time.time()
        state.last_at = time.time()

    return handle


async def run(cfg: SimConfig) -> SimState:
    from levers9.runtime.bus import Bus
    from levers9.runtime.consumer import WorkConsumer

    bus = await Bus.connect(cfg.nats_url, name=f"levers9-sim-{cfg.worker_id}", auth=bus_auth(cfg.home, cfg.worker_id))
    state, stop = SimState(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    consumer = WorkConsumer(bus, f"worker-{cfg.worker_id}",
                            [subjects.filter_subject(aggregate="container", event_type="ContainerScheduled")],
                            handle=answer_handler(bus, cfg, state), batch=64, ack_wait=60)
    tasks = [asyncio.create_task(consumer.run(stop)), asyncio.create_task(heartbeat(bus, cfg, state, stop))]
    await register(bus, cfg)
    print(json.dumps({"registered": cfg.worker_id, "address": cfg.address}), flush=True)
    await stop.wait()
    await asyncio.gather(*tasks, return_exceptions=True)
    try:
        await (await bus.heartbeats()).delete(cfg.worker_id)  # as a real worker does when it stops
    finally:
        await bus.close()
    return state


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--worker-id", required=True)
    p.add_argument("--pool", default="sim")
    p.add_argument("--nats-url", required=True)
    p.add_argument("--address", default="127.0.0.1")
    p.add_argument("--cpu-millicores", type=int, default=6000)
    p.add_argument("--memory-mib", type=int, default=7680)
    a = p.parse_args(argv)
    cfg = SimConfig(a.home, a.worker_id, a.pool, a.nats_url, a.address, a.cpu_millicores, a.memory_mib)
    state = asyncio.run(run(cfg))
    print(json.dumps({"worker_id": cfg.worker_id, "answered": state.answered, "others_seen": state.others,
                      "first_at": state.first_at, "last_at": state.last_at}), flush=True)


# ---- the launcher bench_hosts.py uses ------------------------------------------------------------

@dataclass
class SimHost:
    worker_id: str
    address: str
    netns: str  # "" in the root namespace
    proc: subprocess.Popen


def start_hosts(home: Path, nats_url: str, count: int, pool: str, cpu_millicores: int, memory_mib: int,
                netns: bool = True) -> list[SimHost]:
    """`count` simulated workers, each its own process; with netns each in a host of its own
    (levers9.runtime.hosts: the underlay bridge, NATS's port DNATed, markers where `levers9 down` looks)."""
    from levers9.runtime import hosts
    from levers9.runtime.config import Settings

    s = Settings.load(env={"LEVERS9_HOME": str(home)})
    if netns:
        hosts.ensure_underlay(s.network.hosts_bridge, s.network.hosts_subnet, [nats_url])
    out = []
    for i in range(1, count + 1):
        worker_id, prefix, address, url, ns = f"{pool}-{i}", [], "127.0.0.1", nats_url, ""
        if netns:
            plan = hosts.add_host(s.network.hosts_bridge, s.network.hosts_subnet, s.network.hosts_container_supernet, home / "hosts" / "live")
            prefix = ["nsenter", f"--net={hosts.NETNS_DIR / plan.netns}", "--"]
            address, url, ns = plan.address, hosts.rewrite_url(nats_url, plan.gateway), plan.netns
        cmd = [*prefix, sys.executable, str(Path(__file__).resolve()), "--home", str(home), "--worker-id", worker_id,
               "--pool", pool, "--nats-url", url, "--address", address, "--cpu-millicores", str(cpu_millicores),
               "--memory-mib", str(memory_mib)]
        log = (home / "logs" / f"sim-{worker_id}.log").open("w")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        out.append(SimHost(worker_id, address, ns, proc))
    return out


def stop_hosts(home: Path, sims: list[SimHost]) -> list[dict]:
    """SIGTERM every simulated worker, collect what each says it answered, remove their hosts."""
    from levers9.runtime import hosts
    from levers9.runtime.config import Settings

    for sim in sims:
        if sim.proc.poll() is None:
            sim.proc.send_signal(signal.SIGTERM)
    reports = []
    for sim in sims:
        try:
            out, _ = sim.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            sim.proc.kill()
            out, _ = sim.proc.communicate()
        lines = [json.loads(line) for line in (out or "").splitlines() if line.startswith("{")]
        reports.append(next((x for x in reversed(lines) if "answered" in x), {"worker_id": sim.worker_id}))
    s = Settings.load(env={"LEVERS9_HOME": str(home)})
    for sim in sims:
        n = hosts.index_of(sim.netns) if sim.netns else None
        if n is not None:
            hosts.remove_host(hosts.host_plan(n, s.network.hosts_subnet, s.network.hosts_container_supernet))
            (home / "hosts" / "live" / sim.netns).unlink(missing_ok=True)
    return reports


if __name__ == "__main__":
    main()
