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
