"""A notebook's idle dumps do not pile up: once a new one is stored, the ones past the newest two are
deleted (CheckpointDeleted), and nothing of any other deployment is ever deleted here."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from levers9 import App
from levers9.checkpoint_store.pruning import (
    KEEP_IDLE_DUMPS,
    PRUNABLE,
    Stored,
    keeps_idle_dumps,
    prune_idle_dumps,
    superseded,
)
from levers9.contracts import decode, encode, envelope
from levers9.contracts import events as E

STATUSES = ("dumped", "available", "restore_failed", "checkpoint_failed", "deleted")


@given(st.lists(st.tuples(st.sampled_from(STATUSES)), max_size=12), st.integers(0, 11), st.integers(1, 4))
def test_the_newest_stored_ones_are_kept_and_every_other_stored_one_is_deleted(statuses, where, keep):
    rows = [Stored(f"c{i:02d}", s) for i, (s,) in enumerate(statuses)]  # newest first
    now = rows[where].checkpoint_id if where < len(rows) else "c-now"
    gone = superseded(rows, now, keep)
    stored = [r.checkpoint_id for r in rows if r.status in PRUNABLE and r.checkpoint_id != now]
    assert now not in gone
    assert gone == stored[keep - 1:]  # the one stored now is one of the `keep`
    assert all(r.status in PRUNABLE for r in rows if r.checkpoint_id in gone)  # a dump in flight is never touched


def spec_of(**box) -> str:
    app = App("notebooks")
    if box:
        app.box("b", command=["sleep", "1"], port=8000, checkpoint_enabled=True, **box)
    else:
        app.notebook("lab")
    return json.dumps(app.specs()[0])


def test_only_a_box_dumped_when_idle_keeps_its_newest_dumps_only():
    assert keeps_idle_dumps(spec_of()) and keeps_idle_dumps(json.loads(spec_of()))
    assert keeps_idle_dumps(spec_of(idle_checkpoint=True))
    assert not keeps_idle_dumps(spec_of(idle_checkpoint=False))
    assert not keeps_idle_dumps('{"not": "a spec"}')


class FakePool:
    def __init__(self, spec: str | None, rows: list[tuple[str, str]]) -> None:
        self.spec, self.rows = spec, rows

    async def fetchval(self, query: str, *args):
        assert "checkpoint_store.deployments" in query and args == ("acme", "lab-v1")
        return self.spec

    async def fetch(self, query: str, *args):
        assert "ORDER BY created_at DESC" in query and args == ("acme", "lab-v1")
        return [{"checkpoint_id": c, "status": s} for c, s in self.rows]


async def test_a_stored_idle_dump_deletes_what_it_superseded_caused_by_its_dump():
    dumped = E.CheckpointDumped(checkpoint_id="c4", deployment_id="lab-v1", worker_id="w1", size_bytes=1,
                                sha256="x", location="http://node/c4")
    env = envelope(dumped, workspace="acme")
    rows = [("c4", "dumped"), ("c5", "dumped"), ("c3", "available"), ("c2", "restore_failed"), ("c1", "available")]
    said: list = []

    async def publish(e):
        said.append(e)

    assert await prune_idle_dumps(FakePool(spec_of(), rows), publish, env, dumped) == ["c2", "c1"]
    assert [decode(encode(e)).event for e in said] == [E.CheckpointDeleted(checkpoint_id="c2"),
                                                      E.CheckpointDeleted(checkpoint_id="c1")]
    assert all(e.causation_id == env.id and e.workspace == "acme" for e in said)
    assert KEEP_IDLE_DUMPS == 2  # c4 (stored now) and c3; c5 is still being stored
    said.clear()
    assert await prune_idle_dumps(FakePool(spec_of(idle_checkpoint=False), rows), publish, env, dumped) == []
    assert await prune_idle_dumps(FakePool(None, rows), publish, env, dumped) == [] and not said
