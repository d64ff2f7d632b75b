"""The benchmarks build events themselves: they must stay valid as the contracts change (a bench
that no longer runs measures nothing)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from levers9.contracts import decode, encode

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module", autouse=True)
def bench_on_path():
    sys.path.insert(0, str(BENCH))
    yield
    sys.path.remove(str(BENCH))


def test_every_bench_script_imports():
    for path in sorted(BENCH.glob("*.py")):
        importlib.import_module(path.stem)


def test_the_publisher_makes_valid_container_requests_carrying_the_spec():
    make = importlib.import_module("_publisher").make
    for i in range(60):
        msg = decode(encode(make(i, 10, "default")))
        assert msg.event.spec is not None and msg.event.resources.cpu_millicores == 500


def test_the_replay_log_is_valid_events():
    log = importlib.import_module("bench_replay").make_log(1200)
    types = {decode(encode(env)).envelope.type for env in log}
    assert {"DeploymentCreated", "ContainerRequested", "ContainerScheduled", "ContainerStopped"} <= types
