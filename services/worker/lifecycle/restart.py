"""What a worker says at start about the containers a previous run of it left behind.

A worker killed without stopping (SIGKILL, a crash, a reboot of the node) leaves containers that
the log still places on it. Its next start removes what is left of them on the node
(`runtime.cleanup_all`); this module then says they failed, before the worker registers. So the
scheduler frees their slots and their deployments get new containers at once, instead of when the
dead run's heartbeat expires (and then, re-requested away from this worker, possibly nowhere).

A placement of one of them still in this worker's consumer (delivered again because the dead run
never acknowledged it) is older than the ContainerFailed said here: it is marked overtaken, and
the worker skips it rather than starting a container the log says failed. It then says the node is
fenced (WorkerFenced): nothing of the dead run runs any more.

Fencing without the worker (`python -m levers9.worker.lifecycle.restart reap WORKER_ID`, run by the pool
controller for a worker it declared lost, and by `levers9 down`): the worker's state dir has a run
lock (flock) that its live run holds for its whole life and the kernel frees when it dies, so a free
lock proves no run of it is alive; a held one belongs to a run that was declared lost while alive
(hung, cut off), which the reaper kills (pid and start time recorded in the lock) before it removes
everything that run left: runc/CRIU processes of its root, its containers (a paused one is thawed
and its cgroup killed), overlay and FUSE mounts, veths, network namespaces, address claims, buckets.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import nats.js.errors
import psutil

from levers9.contracts import SYSTEM_WORKSPACE, envelope, subjects
from levers9.contracts import events as E

from .placement import Overtaken

log = logging.getLogger("levers9.worker.lifecycle.restart")

# the statuses of a container a run of this worker had begun to start (or had started)
BEGUN = ("starting", "ready", "stopping")
# 'scheduled' is one of them only when the dead run had acknowledged the placement: a run
# acknowledges it as soon as the start is under way, so it may have died before ContainerStarted;
# a placement it had not acknowledged is delivered again to this run, which starts it
ON_A_WORKER = ("scheduled", *BEGUN)
REASON = ("its worker {worker} ended without stopping it (killed or crashed); the worker's next start "
          "removed what was left of it")
PROJECTION_WAIT_S = 30.0
PLACEMENTS = "worker-{}"  # the worker's durable consumer of its placements (WorkerService.reactions)
RUN_LOCK = "run.lock"  # in the worker's state dir: held by its live run (and by a reaper at work)
LOCK_WAIT_S = 120.0


def gone(rows: Iterable[Mapping[str, Any]], running: Iterable[str], acked: int) -> list[tuple[str, str, str]]:
    """(workspace, container id, correlation id) of each container the projection places on this
    worker that no run will start or run any more (pure). `rows` are this worker's containers (with
    their status and the stream sequence of their last event), `running` what this run runs, and
    `acked` the sequence up to which this worker's placements consumer acknowledged everything."""
    live = set(running)
    return sorted((r["workspace"], r["container_id"], r["correlation_id"] or "") for r in rows
                  if r["container_id"] not in live
                  and (r["status"] in BEGUN or (r["status"] == "scheduled" and r["last_seq"] <= acked)))


async def acked_up_to(bus: Any, durable: str) -> int:
    """The consumer's acknowledgement floor: every message up to it was acknowledged (0: none)."""
    try:
        info = await bus.js.consumer_info(subjects.STREAM, durable)
    except nats.js.errors.NotFoundError:
        return 0
    return int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0


async def report_gone(service: Any, removed: list[str], overtaken: Overtaken) -> int:
    """Append ContainerFailed for each container a previous run left; how many. `service` is the
    worker's Service (its bus, pool, schema, projection positions, worker id and running
    containers); `removed` is what cleanup_all removed of them on the node."""
    if removed:
        log.warning("removed %d containers left by a previous run: %s", len(removed), removed)
    wanted = await service.bus.last_seq(subjects.filter_subject(aggregate="container"))
    if not await service.wait_projected(wanted, "containers", timeout=PROJECTION_WAIT_S):
        log.warning("containers projection did not reach sequence %d in %.0f s; reporting what it holds",
                    wanted, PROJECTION_WAIT_S)
    rows = await service.pool.fetch(
        f"SELECT workspace, container_id, status, correlation_id, last_seq FROM {service.schema}.containers "
        "WHERE worker_id = $1 AND status = ANY($2::text[])", service.worker_id, list(ON_A_WORKER))
    found = gone(rows, service.containers, await acked_up_to(service.bus, PLACEMENTS.format(service.worker_id)))
    for workspace, container_id, correlation_id in found:
        failed = E.ContainerFailed(container_id=container_id, worker_id=service.worker_id,
                                   reason=REASON.format(worker=service.worker_id))
        ack = await service.bus.publish(envelope(failed, workspace=workspace, correlation_id=correlation_id or None))
        overtaken.saw(container_id, ack.seq, "a previous run of this worker left it and it was reported failed")
    if found:
        log.warning("reported %d containers a previous run of this worker left as failed: %s",
                    len(found), [cid for _, cid, _ in found])
    # whatever was left is gone: a WorkerLost that awaits a fence (its containers wait to be placed
    # again) is answered here when the pool controller could not do it itself
    await service.bus.publish(envelope(E.WorkerFenced(worker_id=service.worker_id, containers=sorted(removed),
                                                      by="its next start"), workspace=SYSTEM_WORKSPACE))
    return len(found)


# ---- the run lock ------------------------------------------------------------------------------

def try_run_lock(state_dir: Path) -> int | None:
    """The run lock's fd (held now, and recorded as this process's), or None when a live process holds it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / RUN_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    me = psutil.Process()
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": me.pid, "started": me.create_time()}).encode(), 0)
    return fd


def take_run_lock(state_dir: Path, timeout: float = LOCK_WAIT_S, what: str = "worker") -> int:
    """Wait for the run lock (a reaper removing what a dead run left holds it for seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        fd = try_run_lock(state_dir)
        if fd is not None:
            return fd
        if time.monotonic() >= deadline:
            raise RuntimeError(f"another process (pid {lock_holder(state_dir) or '?'}) holds the state of {what} "
                               f"{state_dir.name}: a second run of the same worker id? Stop it first.")
        time.sleep(0.2)


def lock_holder(state_dir: Path) -> int | None:
    """The live process recorded in the run lock (pid and start time both match), or None."""
    rec = lock_record(state_dir)
    return rec[0] if rec else None


def lock_record(state_dir: Path) -> tuple[int, float] | None:
    """(pid, start time) of the live process recorded in the run lock, or None."""
    try:
        rec = json.loads((state_dir / RUN_LOCK).read_text() or "{}")
        proc = psutil.Process(int(rec["pid"]))
        return (proc.pid, float(rec["started"])) if same_time(proc.create_time(), float(rec["started"])) else None
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return None


def same_time(a: float, b: float) -> bool:
    return abs(a - b) < 0.01  # a process's start time as psutil reads it, recorded as JSON


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant, and wait for them (a frozen one is not waited on)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in procs):
        time.sleep(0.05)


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie: the killed run is its pool controller's child, not ours, and stays a
    zombie until that controller reaps it (psutil.wait_procs waited its whole timeout on it: 10 s of
    every netns fence)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def strays_of(runc_root: Path) -> list[int]:
    """runc processes of this root (a checkpoint or restore the dead run had started: CRIU is their
    child) still alive after their worker."""
    root = str(runc_root)
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info.get("cmdline") or []
        if p.pid != os.getpid() and any(root == a or a.startswith(root + "/") for a in cmd):
            out.append(p.pid)
    return out


# ---- the reaper --------------------------------------------------------------------------------

async def reap(settings: Any, worker_id: str, alive_at: float | None = None,
               lost_run: tuple[int, float] | None = None) -> list[str]:
    """Stop and remove everything a dead (or lost) run of `worker_id` left on this node; the ids
    of the containers removed. The run still alive (declared lost while it ran) is killed first.

    `lost_run`: the lost run's pid and start time (from its heartbeats); `alive_at`: when it was
    last known alive. A run holding the lock that is not the lost one is a newer run (`levers9 up`
    restarted the worker meanwhile): it is left alone, and nothing is removed here, because a run
    takes the lock before it removes what the runs before it left (lost_run_holds)."""
    from levers9.worker.mounts import volumes
    from levers9.worker.runtime.choice import choose_runtime

    state_dir = settings.home_path / "workers" / worker_id
    if not state_dir.is_dir():
        return []
    fd = try_run_lock(state_dir)
    if fd is None:
        holder = lock_record(state_dir)
        if holder is not None and not lost_run_holds(holder, lost_run, alive_at):
            log.warning("worker %s: a newer run (pid %d) holds its state; it removed what the lost run left",
                        worker_id, holder[0])
            return []
        if holder is not None:
            log.warning("worker %s (pid %d) still runs though it was lost: killing it", worker_id, holder[0])
            kill_tree(holder[0])
        fd = await asyncio.to_thread(take_run_lock, state_dir, 30.0)
    try:
        for pid in strays_of(state_dir / "runc"):
            kill_tree(pid)
        runtime, _ = choose_runtime(settings, state_dir)
        removed = await runtime.cleanup_all()
        await volumes.WorkerVolumes(settings, worker_id, state_dir, _no_secrets).clean_stale()
        return removed
    finally:
        os.close(fd)


def lost_run_holds(holder: tuple[int, float], lost_run: tuple[int, float] | None, alive_at: float | None) -> bool:
    """Whether the run holding the lock (pid, start time) is the lost run (pure). Known by its pid and
    start time when its heartbeats said them; else a run started after `alive_at` (its last beat) is
    a newer one. The time alone misjudged under load: the controller notes a beat when it reads it,
    which may be after `levers9 up` started the next run. Nothing known: the holder is taken for it."""
    if lost_run is not None:
        return holder[0] == lost_run[0] and same_time(holder[1], lost_run[1])
    if alive_at is not None:
        return holder[1] <= alive_at
    return True


async def _no_secrets(container_id: str, names: list[str]) -> dict[str, str]:
    return {}


def main(argv: list[str]) -> int:
    """`python -m levers9.worker.lifecycle.restart reap WORKER_ID [--alive-at EPOCH] [--lost-run PID@STARTED]`:
    prints {"removed": [...]} as its last line."""
    from levers9.runtime.config import Settings

    args = argparse.ArgumentParser(prog="python -m levers9.worker.lifecycle.restart")
    args.add_argument("command", choices=["reap"])
    args.add_argument("worker_id")
    args.add_argument("--alive-at", type=float, default=None,
                      help="when the lost run was last seen alive (epoch seconds): a run started later is left alone")
    args.add_argument("--lost-run", default=None, metavar="PID@STARTED",
                      help="the lost run's pid and start time (epoch seconds): any other run is left alone")
    parsed = args.parse_args(argv)
    lost_run = None
    if parsed.lost_run:
        pid, _, started = parsed.lost_run.partition("@")
        lost_run = (int(pid), float(started))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    removed = asyncio.run(reap(Settings.load(), parsed.worker_id, parsed.alive_at, lost_run))
    print(json.dumps({"removed": removed}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
