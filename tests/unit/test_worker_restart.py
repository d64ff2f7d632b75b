"""levers9.worker.lifecycle.restart.gone: which containers a worker's new run reports as failed at start."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from levers9.worker.lifecycle.restart import BEGUN, gone

STATUSES = ("requested", "pending", "scheduled", "starting", "ready", "stopping", "stopped", "failed")


def row(cid: str, status: str, last_seq: int = 10, ws: str = "acme") -> dict:
    return {"workspace": ws, "container_id": cid, "status": status, "correlation_id": f"c-{cid}",
            "last_seq": last_seq}


def test_begun_containers_this_run_does_not_run_are_gone():
    rows = [row("a", "ready"), row("b", "starting"), row("c", "stopping"), row("d", "stopped"),
            row("e", "failed"), row("f", "ready")]
    assert gone(rows, running={"f"}, acked=0) == [("acme", "a", "c-a"), ("acme", "b", "c-b"), ("acme", "c", "c-c")]


def test_a_scheduled_container_is_gone_only_once_its_placement_was_acknowledged():
    rows = [row("early", "scheduled", last_seq=5), row("late", "scheduled", last_seq=9)]
    # placement 9 was never acknowledged: it is delivered again to the new run, which starts it
    assert gone(rows, running=(), acked=7) == [("acme", "early", "c-early")]
    assert gone(rows, running=(), acked=9) == [("acme", "early", "c-early"), ("acme", "late", "c-late")]


@given(st.lists(st.tuples(st.sampled_from(STATUSES), st.integers(1, 100), st.booleans()), max_size=30),
       st.integers(0, 100))
def test_never_what_runs_never_what_ended_and_never_a_placement_still_to_come(specs, acked):
    rows = [row(f"c{i}", status, seq) for i, (status, seq, _) in enumerate(specs)]
    running = {f"c{i}" for i, (_, _, runs) in enumerate(specs) if runs}
    out = {cid for _, cid, _ in gone(rows, running, acked)}
    by_id = {r["container_id"]: r for r in rows}
    for cid in out:
        r = by_id[cid]
        assert cid not in running
        assert r["status"] in BEGUN or (r["status"] == "scheduled" and r["last_seq"] <= acked)
    for r in rows:  # and everything begun that does not run is reported
        if r["status"] in BEGUN and r["container_id"] not in running:
            assert r["container_id"] in out


# ---- the run lock and the reaper (fencing a dead or lost run) ------------------------------------

HOLD = """
import sys, time
from pathlib import Path
from levers9.worker.lifecycle.restart import take_run_lock
take_run_lock(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


def _holder(state_dir):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(state_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_the_run_lock_is_held_while_its_run_lives_and_free_once_it_died(tmp_path):
    import os

    from levers9.worker.lifecycle.restart import lock_holder, try_run_lock

    proc = _holder(tmp_path)
    try:
        assert try_run_lock(tmp_path) is None and lock_holder(tmp_path) == proc.pid
    finally:
        proc.kill()
        proc.wait()
    fd = try_run_lock(tmp_path)  # the kernel freed it with its process: no run of it is alive
    assert fd is not None and lock_holder(tmp_path) == os.getpid()
    os.close(fd)


async def test_the_reaper_kills_a_run_declared_lost_while_alive_then_removes_what_it_left(tmp_path):
    from levers9.runtime.config import Settings
    from levers9.worker.lifecycle.restart import reap, try_run_lock

    state_dir = tmp_path / "workers" / "w-lost"
    (state_dir / "containers" / "c-left").mkdir(parents=True)
    proc = _holder(state_dir)
    try:
        removed = await reap(Settings().with_(home=str(tmp_path), runtime="process"), "w-lost")
        assert proc.wait(timeout=10) is not None  # killed: a lost run must not go on running its containers
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert removed == ["c-left"] and not (state_dir / "containers" / "c-left").exists()
    assert try_run_lock(state_dir) is not None  # and it let go of the lock
    assert await reap(Settings().with_(home=str(tmp_path), runtime="process"), "never-ran") == []


async def test_the_reaper_spares_a_newer_run_that_started_after_the_lost_one_was_last_alive(tmp_path):
    """`levers9 up` restarted the worker before its lost run was fenced: the lock holder is that new
    run, which removed what the lost run left when it started; killing it would lose a live worker."""
    import time

    from levers9.runtime.config import Settings
    from levers9.worker.lifecycle.restart import reap

    state_dir = tmp_path / "workers" / "w-back"
    state_dir.mkdir(parents=True)
    last_beat_of_the_lost_run = time.time() - 60
    proc = _holder(state_dir)
    try:
        assert await reap(Settings().with_(home=str(tmp_path), runtime="process"), "w-back",
                          last_beat_of_the_lost_run) == []
        assert proc.poll() is None  # alive
        # the same run, last seen alive after it started, is the lost one: killed
        await reap(Settings().with_(home=str(tmp_path), runtime="process"), "w-back", time.time())
        assert proc.wait(timeout=10) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_the_reaper_told_which_run_was_lost_spares_any_other_run_whatever_the_times_say(tmp_path):
    """CI: under load the controller read the lost run's last beat after `levers9 up` had started the
    next run, so that run looked older than the last beat; the reaper killed it and the worker was gone.
    Told the lost run's pid and start time, the reaper kills that run only."""
    import time

    from levers9.runtime.config import Settings
    from levers9.worker.lifecycle.restart import lock_record, reap

    state_dir = tmp_path / "workers" / "w-next"
    state_dir.mkdir(parents=True)
    proc = _holder(state_dir)
    try:
        holder = lock_record(state_dir)
        assert holder is not None and holder[0] == proc.pid
        settings = Settings().with_(home=str(tmp_path), runtime="process")
        lost_run = (proc.pid + 100000, holder[1] - 5.0)  # another run: the one that was SIGKILLed
        assert await reap(settings, "w-next", time.time() + 60, lost_run) == []
        assert proc.poll() is None  # alive, although its start is before the time given as the last beat
        await reap(settings, "w-next", None, holder)  # the run named is the holder: lost while alive, killed
        assert proc.wait(timeout=10) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@given(st.tuples(st.integers(1, 10**6), st.floats(1e9, 2e9)), st.tuples(st.integers(1, 10**6), st.floats(1e9, 2e9)),
       st.none() | st.floats(1e9, 2e9))
def test_a_named_lost_run_is_the_only_one_taken_for_it(holder, lost, alive_at):
    from levers9.worker.lifecycle.restart import lost_run_holds

    assert lost_run_holds(holder, lost, alive_at) == (holder[0] == lost[0] and abs(holder[1] - lost[1]) < 0.01)
    assert lost_run_holds(holder, holder, alive_at)
    assert lost_run_holds(holder, None, alive_at) == (alive_at is None or holder[1] <= alive_at)


def test_kill_tree_does_not_wait_on_a_zombie_it_cannot_reap():
    """The lost run is its pool controller's child: killed, it stays a zombie until that controller
    reaps it, and the reaper (not its parent) must count it gone at once, not after a timeout."""
    import subprocess
    import time

    from levers9.worker.lifecycle.restart import kill_tree

    # a parent that never reaps: its child, killed, stays a zombie (as the lost run does for the reaper)
    parent = subprocess.Popen(["python3", "-c", "import subprocess, time; p = subprocess.Popen(['sleep', '60']); "
                                                "print(p.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        child = int(parent.stdout.readline())
        t0 = time.monotonic()
        kill_tree(child)
        assert time.monotonic() - t0 < 5
        import psutil
        assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    finally:
        parent.kill()
        parent.wait()
