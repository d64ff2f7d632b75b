"""Which unpacked checkpoints a worker removes: all but the newest few, never one a restore reads now
(a fourth distinct restore used to remove the images CRIU was reading for the first), and a folder
another eviction empties meanwhile is no error."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from levers9.worker.runtime.runc.dump_restore import _ages, evictable

names = st.text("abcdef0123456789", min_size=1, max_size=6)
ages_st = st.dictionaries(names, st.floats(min_value=0, max_value=1e9, allow_nan=False), max_size=12)


@given(ages_st, st.integers(min_value=0, max_value=5), st.sets(names, max_size=6))
def test_only_old_idle_ones_go_and_the_newest_stay(ages, keep, busy):
    gone = evictable(ages, keep, busy)
    assert set(gone) <= set(ages) and not set(gone) & busy  # never a busy one
    newest = sorted(ages, key=lambda n: ages[n], reverse=True)[:keep]
    assert not set(gone) & set(newest)  # the newest `keep` stay
    assert set(ages) - set(gone) - busy == set(newest) - busy  # every other idle one goes
    assert len(ages) - len(gone) <= keep + len(busy & set(ages))  # nothing kept beyond what is needed


def test_a_restore_in_flight_keeps_its_checkpoint_past_the_newest_three():
    ages = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    assert evictable(ages, 3, {"d"}) == ["a"]
    assert evictable(ages, 3, {"a", "d"}) == []  # "a" is read by a restore: it stays, one more than three


def test_ages_leave_out_half_made_ones_and_entries_gone_meanwhile(tmp_path, monkeypatch):
    for name in ("x", "y", ".x.tmp1234"):
        (tmp_path / name).mkdir()
    real_scandir = os.scandir

    def scandir_then_remove_y(path):  # another eviction removes "y" between the listing and its stat
        entries = list(real_scandir(path))
        (tmp_path / "y").rmdir()
        return iter(entries)

    monkeypatch.setattr(os, "scandir", scandir_then_remove_y)
    assert set(_ages(tmp_path)) == {"x"}
