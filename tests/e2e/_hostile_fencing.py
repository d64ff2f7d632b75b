"""Hostile-tenant cases: fencing (collected through test_hostile_tenant.py).

A worker SIGKILLed in the middle of a leave-running dump (its runc and CRIU with it, as a crash of
the node's worker would): its container stays frozen (runc paused it around CRIU). Before, the
container kept running (paused) after its worker was declared lost while the same container id was
placed again on the other worker (it ran twice), and it, its overlay mount, veth and network
namespace outlived `levers9 down`. Now the pool controller reaps what the dead worker left before
the scheduler places its containers again (WorkerFenced), and `down` leaves nothing.

This case kills a worker, so it starts a stack of its own (`fencing_env`): `levers9 up`'s own worker
(pool `default`, with CRIU; it is that pool's one warm worker). Once it is lost and fenced, the pool
controller starts another for the backlog, and the container is placed there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from _e2e import api, cli, wait_until
from _faults import Node

from levers9.runtime.ports import free_port
from levers9.worker.runtime.runc.bundle import cgroups_path
from levers9.worker.runtime.runc.cgroups import cgroup_mounts

APP = '''
import time

from levers9 import App

app = App("fenced")


def build():
    return {"table": list(range(200_000)), "built_at": time.time()}


@app.endpoint(cpu=0.25, memory="256Mi", keep_warm_seconds=600, on_start=build, checkpoint_enabled=True, timeout=120)
def fenced(context):
    return {"built_at": context.on_start_value["built_at"]}
'''
RECOVERY_S = 300


@pytest.fixture(scope="module")
def fencing_env(tmp_path_factory):
    """As _e2e.one_worker_stack (pool `default`: one warm worker, one at most), with a node cache port
    of its own: another stack on this machine may serve the default one (2050) for its own home."""
    home = tmp_path_factory.mktemp("l9fence")
    pools = home / "pools.toml"
    pools.write_text('[pools.default]\nbackend = "local"\nmin_warm = 1\nmax_workers = 1\nidle_timeout_s = 600\n'
                     'worker_cpu_millicores = 2000\nworker_memory_mib = 2048\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    env.update(LEVERS9_HOME=str(home), LEVERS9_POOLS_FILE=str(pools), LEVERS9_WORKER_CPU_MILLICORES="2000",
               LEVERS9_WORKER_MEMORY_MIB="2048", LEVERS9_CACHE_PORT=str(free_port()))
    try:
        cli(env, "up")
        wait_until(lambda: _criu_workers(env), timeout=900)
        yield env
    finally:
        cli(env, "down", check=False)


def _criu_workers(env: dict) -> list[dict]:
    rows = api(env, "GET", "/api/v1/workers").json()
    if not isinstance(rows, list):  # an error body (a restart, a refusal): print it, ask again
        print(f"workers: {rows}", flush=True)
        return []
    return [w for w in rows if w["status"] == "ready" and "criu" in w["features"] and w["pool"] == "default"]


def _runc_everywhere(home: Path) -> list[tuple[str, str, str]]:
    """(worker, container id, status) of every runc container under every worker root of the home."""
    out = []
    for root in sorted((home / "workers").glob("*/runc")):
        r = subprocess.run([shutil.which("runc") or "runc", "--root", str(root), "list", "--format", "json"],
                           capture_output=True, text=True, timeout=30)
        out += [(root.parent.name, c["id"], c["status"]) for c in json.loads(r.stdout or "null") or []]
    return out


def _freezer_files(cid: str) -> list[tuple[Path, str]]:
    """The file that says a container's cgroup is frozen, with the word that says so."""
    out = []
    for mount_point, fstype, options in cgroup_mounts():
        base = Path(mount_point) / cgroups_path(cid).lstrip("/")
        if fstype == "cgroup" and "freezer" in options.split(","):
            out.append((base / "freezer.state", "FROZEN"))
        elif fstype == "cgroup2":
            out.append((base / "cgroup.freeze", "1"))
    return out


class _KillOnFreeze(threading.Thread):
    """The first container of this home whose cgroup freezes (runc paused it around its dump): its
    worker is SIGKILLed then, with its runc and CRIU, as a crash of the worker would."""

    def __init__(self, home: Path, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.home, self.pids, self.stop = home, pids, threading.Event()
        self.cid = self.wid = ""
        self.files: dict[str, list[tuple[Path, str]]] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            for root in (self.home / "workers").glob("*/runc"):
                for cid in _listdir(root):
                    for f, word in self.files.setdefault(cid, _freezer_files(cid)):
                        if _read(f) == word:
                            self.cid, self.wid = cid, root.parent.name
                            _kill_tree(self.pids[self.wid])
                            return


def _listdir(d: Path) -> list[str]:
    try:
        return [n for n in os.listdir(d) if not n.startswith(".")]
    except OSError:
        return []


def _read(f: Path) -> str:
    try:
        return f.read_text().strip()
    except OSError:
        return ""


def _worker_pids(home: Path) -> dict[str, int]:
    out = {}
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
        except psutil.Error:
            continue
        if env.get("LEVERS9_HOME") == str(home) and env.get("LEVERS9_WORKER_ID") and "worker" in " ".join(p.cmdline()):
            out[env["LEVERS9_WORKER_ID"]] = p.pid
    return out


def _kill_tree(pid: int) -> None:
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:  # the worker, its runc checkpoint, CRIU
        try:
            p.kill()
        except psutil.Error:
            pass


class _Twice(threading.Thread):
    """Every container id seen running (or paused) under two worker roots at the same moment."""

    def __init__(self, home: Path) -> None:
        super().__init__(daemon=True)
        self.home, self.stop, self.seen = home, threading.Event(), set()

    def run(self) -> None:
        while not self.stop.wait(0.3):
            where: dict[str, set[str]] = {}
            for worker, cid, status in _runc_everywhere(self.home):
                if status in ("running", "paused", "created"):
                    where.setdefault(cid, set()).add(worker)
            self.seen |= {(cid, tuple(sorted(ws))) for cid, ws in where.items() if len(ws) > 1}


def test_a_worker_killed_mid_dump_leaves_nothing_running_twice_or_behind(fencing_env, tmp_path):
    env, home = fencing_env, Path(fencing_env["LEVERS9_HOME"])
    (tmp_path / "fenced.py").write_text(APP)
    cli(env, "deploy", str(tmp_path / "fenced.py"))
    pids = _worker_pids(home)
    assert pids, "no worker process of this home"
    twice = _Twice(home)
    twice.start()
    killer = _KillOnFreeze(home, pids)
    killer.start()
    # its first cold start is dumped leave-running right after it is ready: runc pauses it around
    # CRIU; its worker dies then (this first call may never be answered: its container stays frozen)
    threading.Thread(target=lambda: _call(env), daemon=True).start()
    killer.join(timeout=300)
    killer.stop.set()
    assert killer.cid, "no container of the stack was ever paused for a dump"
    cid, wid = killer.cid, killer.wid
    killed_at = time.monotonic()
    left = {c: s for w, c, s in _runc_everywhere(home) if w == wid}
    print(f"\nFENCING worker {wid} killed mid-dump of {cid}; its containers then: {left}", flush=True)

    # calls are served again, by a container placed only once the dead worker's was removed
    wait_until(lambda: _call(env) == 200, timeout=RECOVERY_S, every=1)
    served_s = time.monotonic() - killed_at
    twice.stop.set()
    twice.join(timeout=60)
    assert not twice.seen, f"container ids ran on two workers at once: {twice.seen}"
    log = [json.loads(x) for x in cli(env, "events", "replay", "--json").stdout.splitlines()]
    _placed_again_only_after_the_fence(log, cid, wid)
    print(f"FENCING calls served again {served_s:.1f} s after the kill", flush=True)

    ids = {c["container_id"] for c in api(env, "GET", "/api/v1/containers", params={"all": "true"}).json()}
    cli(env, "down")
    after = Node.of(home, ids)
    assert after.runc == {}, f"runc containers left after `levers9 down`: {after.runc}"
    assert not after.veths, f"veths left: {after.veths}"
    assert not after.namespaces, f"namespaces left: {after.namespaces}"
    assert not after.mounts, f"mounts left under the home: {after.mounts}"


def _call(env: dict) -> int:
    try:
        return api(env, "POST", "/endpoint/fenced", json={}, timeout=60).status_code
    except httpx.HTTPError:
        return 0


def _placed_again_only_after_the_fence(log: list[dict], cid: str, dead: str) -> None:
    """In the log, the container is placed on another worker only after the dead one's WorkerFenced
    (before: it was placed again the moment its worker was declared lost, its paused copy still there)."""
    fenced = [i for i, e in enumerate(log) if e.get("type") == "WorkerFenced" and e["data"]["worker_id"] == dead]
    elsewhere = [i for i, e in enumerate(log) if e.get("type") in ("ContainerScheduled", "ContainerStarted")
                 and e["data"].get("container_id") == cid and e["data"].get("worker_id") != dead]
    if elsewhere:
        assert fenced and fenced[0] < elsewhere[0], \
            f"container {cid} was placed again before worker {dead} was fenced (fenced at {fenced}, started at {elsewhere})"
