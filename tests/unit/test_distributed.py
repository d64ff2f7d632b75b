"""levers9.distributed: one process per card, each with its rank's environment (a configured 2-card
environment: no GPU needed, the environment each rank sees is what is checked)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from levers9 import distributed
from levers9.distributed import RankFailed, cards, device_of, rank_env

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES")


def seen(tag: str) -> dict:
    """What a rank sees (module level: pickled by reference or by value alike)."""
    return {"tag": tag, "pid": os.getpid(), **{k: os.environ.get(k) for k in KEYS}}


def fail_on_rank_one() -> int:
    if os.environ["RANK"] == "1":
        raise ValueError("bad shard 1")
    return int(os.environ["RANK"])


def die_on_rank_zero() -> None:
    if os.environ["RANK"] == "0":
        os._exit(3)
    import time
    time.sleep(60)  # rank 1 would wait on its peer for ever: the launcher ends it


@pytest.fixture
def two_cards(monkeypatch):
    """A levers9 GPU container with two configured cards, as the worker starts one."""
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("LEVERS9_CONTAINER_ID", "c1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_one_process_per_card_with_its_rank(two_cards):
    results = distributed.run(seen, "x")
    assert [r["RANK"] for r in results] == ["0", "1"] and [r["LOCAL_RANK"] for r in results] == ["0", "1"]
    assert {r["WORLD_SIZE"] for r in results} == {"2"} and {r["LOCAL_WORLD_SIZE"] for r in results} == {"2"}
    assert {r["MASTER_ADDR"] for r in results} == {"127.0.0.1"}
    port = {r["MASTER_PORT"] for r in results}
    assert len(port) == 1 and 0 < int(port.pop()) < 65536
    assert [r["CUDA_VISIBLE_DEVICES"] for r in results] == ["0", "1"]  # one card each, numbered in the container
    assert len({r["pid"] for r in results} | {os.getpid()}) == 3 and {r["tag"] for r in results} == {"x"}


def test_a_function_of_the_callers_own_code_runs_by_value(two_cards):
    offset = 10
    assert distributed.run(lambda: int(os.environ["RANK"]) + offset) == [10, 11]  # cloudpickle is here


def test_uuid_cards_are_given_by_uuid(monkeypatch):
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "GPU-aaa,GPU-bbb")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [r["CUDA_VISIBLE_DEVICES"] for r in distributed.run(seen, "u")] == ["GPU-aaa", "GPU-bbb"]


def test_a_ranks_exception_propagates_with_its_rank(two_cards):
    with pytest.raises(RankFailed, match="rank 1 failed: ValueError: bad shard 1") as caught:
        distributed.run(fail_on_rank_one)
    assert caught.value.rank == 1 and isinstance(caught.value.__cause__, ValueError)
    assert "fail_on_rank_one" in caught.value.remote_traceback


def test_a_dead_rank_ends_the_others(two_cards):
    with pytest.raises(RankFailed, match="rank 0 failed: ended with status 3") as caught:
        distributed.launch(die_on_rank_zero, timeout=50)
    assert caught.value.rank == 0


def test_no_cards_is_refused_unless_nprocs_says(monkeypatch):
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(ValueError, match="no GPU cards"):
        distributed.run(seen, "none")
    assert [r["WORLD_SIZE"] for r in distributed.launch(seen, ("n",), nprocs=3)] == ["3"] * 3


def test_rank_environment_rules():
    env = {"NVIDIA_VISIBLE_DEVICES": "2,3"}
    assert rank_env(1, 2, 29500, env)["CUDA_VISIBLE_DEVICES"] == "3"  # a bare host: the index itself
    assert device_of(1, ["2", "3"], {"LEVERS9_CONTAINER_ID": "c"}) == "1"  # a container numbers its own from 0
    assert device_of(0, ["2", "3"], {"CUDA_VISIBLE_DEVICES": "5,6"}) == "5"  # an existing list is split
    with pytest.raises(ValueError):
        device_of(2, [], {"CUDA_VISIBLE_DEVICES": "5,6"})
    assert cards({"NVIDIA_VISIBLE_DEVICES": "void"}) == [] and cards({}) == []
    with pytest.raises(ValueError, match="all"):
        cards({"NVIDIA_VISIBLE_DEVICES": "all"})
    e = rank_env(0, 4, 1234, {"X": "1"})
    assert (e["X"], e["RANK"], e["WORLD_SIZE"], e["MASTER_PORT"]) == ("1", "0", "4", "1234")


def test_the_module_runs_a_script_once_per_card(tmp_path):
    script = tmp_path / "train.py"
    out = tmp_path / "out"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        open(os.path.join({str(out)!r}, os.environ["RANK"]), "w").write(
            " ".join([os.environ["WORLD_SIZE"], os.environ["CUDA_VISIBLE_DEVICES"]] + sys.argv[1:]))
    """))
    out.mkdir()
    env = {**os.environ, "NVIDIA_VISIBLE_DEVICES": "0,1", "LEVERS9_CONTAINER_ID": "c1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run([sys.executable, "-m", "levers9.distributed", str(script), "--epochs", "3"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert {p.name: p.read_text() for p in out.iterdir()} == {"0": "2 0 --epochs 3", "1": "2 1 --epochs 3"}
    script.write_text("import os, sys\nsys.exit(4 if os.environ['RANK'] == '1' else 0)\n")
    failed = subprocess.run([sys.executable, "-m", "levers9.distributed", str(script)], env=env,
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1 and "rank 1 failed" in failed.stderr
