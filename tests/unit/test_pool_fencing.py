"""The pool controller's fencing of lost workers (levers9.pool_controller.fencing): WorkerFenced only
after the reaper succeeded, a failed fence stays pending, and a restarted controller finds the lost
workers whose fence is still to be done from the log."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import nats.js.errors

from levers9.contracts import SYSTEM_WORKSPACE, decode, encode, envelope
from levers9.contracts import events as E
from levers9.pool_controller.fencing import FenceFailed, Fencer, LostRun


class _Bus:
    def __init__(self, last: dict[str, tuple[int, E.Event]] | None = None) -> None:
        self.published: list = []
        self.last = last or {}
        self.js = self

    async def publish(self, env) -> None:
        self.published.append(env)

    async def get_last_msg(self, stream: str, subject: str):
        wid, etype = subject.split(".")[-2:]
        if (wid, etype) not in self.last:
            raise nats.js.errors.NotFoundError()
        seq, ev = self.last[(wid, etype)]
        return SimpleNamespace(seq=seq, data=encode(envelope(ev, workspace=SYSTEM_WORKSPACE)))


async def test_fenced_is_said_only_after_the_reaper_succeeded_and_a_failure_stays_pending(tmp_path):
    fencer = Fencer(tmp_path)
    (tmp_path / "workers" / "w-ok").mkdir(parents=True)
    assert fencer.can_fence("w-ok") and not fencer.can_fence("w-elsewhere")
    outcomes = {"w-ok": ["c1", "c2"], "w-bad": FenceFailed("runc delete failed")}

    async def reap(worker_id, lost=LostRun()):
        out = outcomes[worker_id]
        if isinstance(out, Exception):
            raise out
        return out

    fencer.reap = reap  # type: ignore[method-assign]
    fencer.pending.update({"w-ok": LostRun(100.0), "w-bad": LostRun()})
    bus = _Bus()
    await fencer.fence_pending(bus)
    said = [decode(encode(e)).event for e in bus.published]
    assert said == [E.WorkerFenced(worker_id="w-ok", containers=["c1", "c2"], by="pool-controller")]
    assert fencer.pending == {"w-bad": LostRun()}  # tried again next pass; its containers keep waiting meanwhile


async def test_a_restarted_controller_fences_what_its_previous_run_left_undone():
    bus = _Bus({("w-undone", "WorkerLost"): (10, E.WorkerLost(worker_id="w-undone", awaits_fence=True)),
                ("w-done", "WorkerLost"): (10, E.WorkerLost(worker_id="w-done", awaits_fence=True)),
                ("w-done", "WorkerFenced"): (12, E.WorkerFenced(worker_id="w-done")),
                ("w-old", "WorkerLost"): (5, E.WorkerLost(worker_id="w-old")),  # written before fencing
                ("w-again", "WorkerFenced"): (3, E.WorkerFenced(worker_id="w-again")),
                ("w-again", "WorkerLost"): (9, E.WorkerLost(worker_id="w-again", awaits_fence=True))})
    fencer = Fencer(Path("/nonexistent"))
    await fencer.recover(bus, ["w-undone", "w-done", "w-old", "w-again", "w-unknown"])
    assert fencer.pending == {"w-undone": LostRun(), "w-again": LostRun()}  # which run was lost: not known


async def test_the_reaper_runs_where_and_with_the_settings_its_backend_says(tmp_path):
    """A netns host's worker is reaped in its host's namespace with its bridge's settings: the prefix
    and settings `where` gives are those the reaper runs with (here a stand-in prints the setting)."""
    import sys

    report = "import json, os; print(json.dumps({'removed': [os.environ['LEVERS9_BRIDGE_NAME']]}))"
    fencer = Fencer(tmp_path, lambda wid: ([sys.executable, "-c", report, "--"], {"LEVERS9_BRIDGE_NAME": f"br-{wid}"}))
    assert await fencer.reap("w7") == ["br-w7"]


async def test_the_reaper_is_told_which_run_was_lost_and_when_it_was_last_alive(tmp_path):
    import sys

    report = "import json, sys; print(json.dumps({'removed': sys.argv[1:]}))"
    fencer = Fencer(tmp_path, lambda wid: ([sys.executable, "-c", report], {}))
    assert (await fencer.reap("w7", LostRun(1700000000.25)))[-2:] == ["--alive-at", "1700000000.25"]
    assert (await fencer.reap("w7", LostRun(1700000000.25, (4242, 1699999990.5))))[-4:] == \
        ["--alive-at", "1700000000.25", "--lost-run", "4242@1699999990.5"]
    said = await fencer.reap("w7")
    assert "--alive-at" not in said and "--lost-run" not in said


def test_a_netns_hosts_reaper_enters_its_host_while_the_host_is_there(tmp_path, monkeypatch):
    from levers9.pool_controller.backends_netns import NetnsBackend
    from levers9.runtime import hosts
    from levers9.runtime.config import Settings

    monkeypatch.setattr(hosts, "NETNS_DIR", tmp_path / "netns")
    settings = Settings().with_(hosts_subnet="10.210.0.0/24", hosts_container_supernet="10.209.0.0/16")
    backend = NetnsBackend(tmp_path, settings=settings)
    plan = hosts.host_plan(3, "10.210.0.0/24", "10.209.0.0/16")
    backend.hosts["w3"] = plan
    assert backend.reaper_where("w3") == ([], {})  # its namespace is gone: reaped here
    (tmp_path / "netns").mkdir()
    (tmp_path / "netns" / plan.netns).touch()
    prefix, env = backend.reaper_where("w3")
    assert prefix == ["nsenter", f"--net={tmp_path / 'netns' / plan.netns}", "--"]
    assert env["LEVERS9_BRIDGE_NAME"] == plan.bridge and env["LEVERS9_BRIDGE_SUBNET"] == plan.container_subnet
    assert backend.reaper_where("w-unknown") == ([], {})


async def test_a_beat_of_the_next_run_during_the_lost_decision_is_not_taken_for_the_lost_run(tmp_path, monkeypatch):
    """CI (stop 33): the worker SIGKILLed, `levers9 up` started the next run, whose first beat came while
    the controller awaited the bus to append WorkerLost; the lost run was then read from the table (that
    beat's time), the reaper took the new run for the lost one and killed it. What the reaper is told is
    read with the decision, before any await."""
    import time

    from levers9.pool_controller import service as svc
    from levers9.runtime.config import Settings

    (tmp_path / "workers" / "local-1").mkdir(parents=True)
    pools = tmp_path / "pools.toml"
    pools.write_text('[pools.default]\nbackend = "local"\nmin_warm = 0\n')
    controller = svc.PoolControllerService(Settings().with_(pools_file=str(pools), home=str(tmp_path)))
    now = time.time()
    table = controller.heartbeats
    table.current, table.seen = True, {"local-1": now - 30}
    table.runs = {"local-1": ((4242, now - 3600), now - 30)}  # the run that was SIGKILLed

    class Rows:
        async def fetch(self, sql, *args):
            return [{"worker_id": "local-1", "status": "ready", "last_seq": 7, "at": now - 3600}]

    class Bus:
        appended: list = []

        async def append(self, env, expected):  # meanwhile the next run's first beat is read
            table.seen["local-1"] = time.time()
            table.runs["local-1"] = ((5151, time.time() - 1), time.time())
            self.appended.append(env)

    async def not_beating(bus, worker_id):
        return False

    monkeypatch.setattr(svc, "still_beating", not_beating)
    controller.pool, controller.bus = Rows(), Bus()  # type: ignore[assignment]
    await controller.declare_lost()
    assert [e.type for e in Bus.appended] == ["WorkerLost"]
    assert controller.fencer.pending == {"local-1": LostRun(now - 30, (4242, now - 3600))}
