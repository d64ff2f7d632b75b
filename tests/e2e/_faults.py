"""Helpers of the fault tests: calls that flow in the background, a server restarted on its own
ports, and what a node holds (runc containers, veths, network namespaces, mounts).

A restarted server keeps its ports, as a server restarted by systemd or a supervisor would: the
services keep their URLs and must find it again by themselves. (`levers9 up` would start a missing
server on new ports, which tells the running services nothing.)"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import httpx

from levers9.runtime.config import Settings
from levers9.stack import Stack


@dataclass
class Flow:
    """POST /endpoint/NAME every `every` s in a thread; every outcome kept as (time, status, text)."""
    env: dict
    name: str = "hello"
    every: float = 0.1
    outcomes: list[tuple[float, int, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> "Flow":
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=200)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as http:
            while not self.stop.wait(self.every):
                # read each time: a gateway restarted by `levers9 up` listens on a new port
                p = tomllib.loads((Path(self.env["LEVERS9_HOME"]) / "config.toml").read_text())
                http.headers["Authorization"] = f"Bearer {p['token']}"
                try:
                    r = http.post(f"{p['gateway_url']}/endpoint/{self.name}", json={"name": "fault"})
                    self.outcomes.append((time.monotonic(), r.status_code, r.text[:300]))
                except httpx.HTTPError as exc:  # the gateway itself is down: no answer at all
                    self.outcomes.append((time.monotonic(), 0, f"{type(exc).__name__}: {exc}"))

    def ok_since(self, t: float) -> int:
        return sum(1 for at, code, _ in self.outcomes if at > t and code == 200)

    def first_ok_after(self, t: float) -> float | None:
        return next((at for at, code, _ in self.outcomes if at > t and code == 200), None)

    def last(self, n: int = 5) -> list[tuple[int, str]]:
        return [(code, text) for _, code, text in self.outcomes[-n:]]

    def failures(self) -> list[tuple[int, str]]:
        return [(code, text) for _, code, text in self.outcomes if code != 200]


def stack_of(env: dict) -> Stack:
    return Stack(Path(env["LEVERS9_HOME"]), Settings.load(env={"LEVERS9_HOME": env["LEVERS9_HOME"]}))


def state_of(env: dict) -> dict:
    return json.loads((Path(env["LEVERS9_HOME"]) / "state.json").read_text())


@contextlib.contextmanager
def server_down(env: dict, name: str) -> Iterator[dict]:
    """Stop server `name` (nats, postgres, s3) as the stack stops it, yield its old entry while it is
    down, then start it again on the same ports (and record it, so `levers9 down` stops it)."""
    from levers9.stack import postgres, procs, s3

    stack = stack_of(env)
    entry = state_of(env)["components"][name]
    stack._stop_server(name, lambda _: None)
    try:
        yield entry
    finally:
        ports = ([entry["port"], entry["monitor_port"]] if name == "nats"  # in the order launch() asks for them
                 else [entry["ports"][n] for n in (*s3.NAMES, *(f"{n}_grpc" for n in s3.NAMES))] if name == "s3"
                 else [entry["port"]])
        saved = procs.free_ports, postgres.free_port
        procs.free_ports = lambda count, host=procs.LOCALHOST: list(ports[:count])
        postgres.free_port = lambda host=procs.LOCALHOST: ports[0]
        try:
            stack.start_servers()
        finally:
            procs.free_ports, postgres.free_port = saved


# ---- what a node holds -----------------------------------------------------------------------

def runc_containers(home: Path) -> dict[str, str]:
    """Every runc container of every worker of the home: id -> status."""
    out: dict[str, str] = {}
    for root in (home / "workers").glob("*/runc"):
        r = subprocess.run([shutil.which("runc") or "runc", "--root", str(root), "list", "--format", "json"],
                           capture_output=True, text=True, timeout=30)
        for c in json.loads(r.stdout or "null") or []:
            out[c["id"]] = c["status"]
    return out


def host_links(prefix: str = "l9h") -> set[str]:
    r = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30)
    return {line.split(":")[1].strip().split("@")[0] for line in r.stdout.splitlines()
            if line.split(":")[1].strip().startswith(prefix)}


def netns() -> set[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return {line.split()[0] for line in r.stdout.splitlines() if line.startswith("l9-")}


def mounts(home: Path) -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if str(home) in line.split()[4]]


def shorts(home: Path, container_ids: set[str]) -> set[str]:
    """The name suffix each of these containers' namespace and veth would carry on each worker of the
    home (levers9.worker.network.bridge.Names: sha1 of the worker's state dir and the container id), so that
    the check counts only what this stack made (other work on the machine has its own)."""
    return {hashlib.sha1(f"{d.resolve()}\0{cid}".encode()).hexdigest()[:10]
            for d in (home / "workers").glob("*") for cid in container_ids}


@dataclass(frozen=True)
class Node:
    runc: dict[str, str]
    veths: frozenset[str]
    namespaces: frozenset[str]
    mounts: tuple[str, ...]

    @classmethod
    def of(cls, home: Path, container_ids: set[str] = frozenset()) -> "Node":  # type: ignore[assignment]
        ours = shorts(home, set(container_ids))
        return cls(runc_containers(home), frozenset(v for v in host_links() if v[3:] in ours),
                   frozenset(n for n in netns() if n[3:] in ours), tuple(mounts(home)))
