"""`levers9 contracts flow` agrees with the code: who appends and who consumes each event type.

The map is derived from the installed services' source (levers9.contracts_flow); these tests fail
when a known path breaks (a service stops appending what another consumes), when an event type is
appended by nobody without being marked external, or when code names an event type that is none.
"""

from __future__ import annotations

import json
import tomllib
from functools import cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from levers9.cli import app
from levers9.contracts.events import EVENT_TYPES
from levers9.contracts_flow import ACTORS, CONTRACTS, EXTERNAL, LIBS, Flow, analyse, installed_sources, sources_under

ROOT = Path(__file__).resolve().parents[2]
TYPES = set(EVENT_TYPES)


@cache
def flow() -> Flow:
    return analyse(installed_sources(), TYPES)


@pytest.mark.parametrize(("event", "appender", "consumer"), [
    ("ContainerRequested", "gateway", "scheduler"),  # the endpoint path: a call needs a container
    ("ContainerScheduled", "scheduler", "worker"),
    ("ContainerReady", "worker", "gateway"),  # the gateway proxies to it once ready
    ("PlacementDeferred", "scheduler", "pool-controller"),  # backlog: scale up
    ("CheckpointDumped", "worker", "checkpoint-store"),  # the checkpoint path
    ("CheckpointStored", "checkpoint-store", "gateway"),
    ("ImageBuildRequested", "gateway", "image-builder"),
    ("ImageBuildStarted", "image-builder", "worker"),  # the builder is a worker of the build pool
    ("WorkerRegistered", "worker", "scheduler"),
    ("WorkerLost", "pool-controller", "scheduler"),
    ("WorkerCatalogueChecked", "worker", "scheduler"),
])
def test_known_paths(event, appender, consumer):
    f = flow()
    assert appender in f.appended_by.get(event, []), f"{event} appended by {f.appended_by.get(event)}"
    assert consumer in f.consumed_by.get(event, []), f"{event} consumed by {f.consumed_by.get(event)}"


def test_function_calls_are_appended_by_the_gateway_for_the_audit_only():
    f = flow()
    for event in ("FunctionCallStarted", "FunctionCallFinished"):
        assert f.appended_by[event] == ["gateway"]


def test_every_event_type_is_appended_by_a_service_or_marked_external():
    f = flow()
    orphans = sorted(t for t in TYPES if not f.appended_by.get(t) and t not in EXTERNAL)
    assert not orphans, f"appended by no service and not in contracts_flow.EXTERNAL: {orphans}"
    assert set(EXTERNAL) <= TYPES
    stale = sorted(t for t in EXTERNAL if f.appended_by.get(t))
    assert not stale, f"marked external but a service appends them now (drop them from EXTERNAL): {stale}"


def test_every_consumed_or_appended_type_exists_and_no_code_names_a_type_that_is_none():
    f = flow()
    assert set(f.consumed_by) <= TYPES and set(f.appended_by) <= TYPES
    assert not f.unknown, f"names used as event types that are none: {f.unknown}"


def test_the_actors_are_the_services_pyproject_maps():
    with open(ROOT / "pyproject.toml", "rb") as fh:
        mapping = tomllib.load(fh)["tool"]["setuptools"]["package-dir"]
    services = {n for n, folder in mapping.items() if folder.startswith("services/")}
    libs = {n for n, folder in mapping.items() if folder.startswith("libs/")}
    assert services | {"levers9"} == set(ACTORS)
    assert libs == {*LIBS, CONTRACTS}


# ---- the analysis on small sources -------------------------------------------------------------

def analyse_small(sources: dict[str, str]) -> Flow:
    return analyse({m: (s, False) for m, s in sources.items()}, TYPES)


def test_a_construction_appends_and_a_mention_consumes_but_an_annotation_does_neither():
    f = analyse_small({
        "levers9.gateway.x": "from levers9.contracts import events as E\n"
                             "from levers9.contracts.events import ContainerStopRequested as Stop\n"
                             "def go(ev: E.WorkerReady) -> E.WorkerLost:\n"
                             "    envelope(E.ContainerRequested(container_id='c'), workspace='w')\n"
                             "    return Stop(container_id='c')\n",
        "levers9.scheduler.y": "from levers9.contracts import events as E\n"
                               "def fold(ev):\n"
                               "    match ev:\n"
                               "        case E.ContainerRequested():\n"
                               "            return isinstance(ev, E.ContainerStopRequested)\n",
        "levers9.worker.z": "from levers9.contracts.subjects import filter_subject\n"
                            "WANTED = [filter_subject(aggregate='container', event_type='ContainerScheduled')]\n",
    })
    assert f.appended_by == {"ContainerRequested": ["gateway"], "ContainerStopRequested": ["gateway"]}
    assert f.consumed_by == {"ContainerRequested": ["scheduler"], "ContainerStopRequested": ["scheduler"],
                             "ContainerScheduled": ["worker"]}


def test_library_code_counts_for_the_services_that_use_it_symbol_by_symbol():
    f = analyse_small({
        "levers9.runtime.views": "STATUS = {'ContainerReady': 'ready'}\n"
                                 "class ContainersView:\n"
                                 "    def apply(self, env): return STATUS.get(env.type)\n"
                                 "class ImagesView:\n"
                                 "    names = ('ImageBuilt',)\n",
        "levers9.runtime.tokens": "from levers9.contracts import events as E\n"
                                  "def mint(): return E.TokenCreated(token_id='t', token_sha256='x')\n",
        "levers9.gateway.state": "from levers9.runtime.views import ContainersView\n"
                                 "from levers9.runtime import tokens\n"
                                 "VIEWS = (ContainersView(),)\n"
                                 "def new(): return tokens.mint()\n",
    })
    assert f.consumed_by == {"ContainerReady": ["gateway"]}  # not ImageBuilt: ImagesView is not used
    assert f.appended_by == {"TokenCreated": ["gateway"]}


def test_a_name_used_as_an_event_type_that_is_none_is_reported():
    f = analyse_small({"levers9.worker.a": "from levers9.contracts import events as E\n"
                                           "from levers9.contracts.subjects import filter_subject\n"
                                           "F = filter_subject(event_type='ContainerExploded')\n"
                                           "def f(ev): return isinstance(ev, E.WorkerVanished)\n"})
    assert f.unknown == {"worker": ["ContainerExploded", "WorkerVanished"]}


def test_sources_are_read_per_root_as_a_wheel_lays_them_out(tmp_path):
    (tmp_path / "gateway").mkdir()
    (tmp_path / "contracts").mkdir()
    for rel in ("__init__.py", "cli.py", "gateway/__init__.py", "gateway/state.py", "contracts/events.py"):
        (tmp_path / rel).write_text("X = 1\n")
    found = sources_under("levers9", tmp_path)
    assert set(found) == {"levers9", "levers9.cli"}  # levers9.gateway is its own root; contracts are not read
    assert found["levers9"][1] is True and found["levers9.cli"][1] is False
    assert set(sources_under("levers9.gateway", tmp_path / "gateway")) == {"levers9.gateway", "levers9.gateway.state"}


def test_installed_sources_read_every_service_through_its_install():
    sources = installed_sources()
    assert {"levers9.gateway.service", "levers9.scheduler.service", "levers9.worker.service", "levers9.cli",
            "levers9.runtime.views"} <= set(sources)
    assert not any(m == CONTRACTS or m.startswith(CONTRACTS + ".") for m in sources)
    assert "levers9.cli" in sources and "levers9.contracts_flow" not in sources  # the analysis reads no type


def test_the_command_prints_the_map_as_json_and_as_a_table():
    runner = CliRunner()
    result = runner.invoke(app, ["contracts", "flow", "--json", "-a", "container"])
    assert result.exit_code == 0, result.output
    rows = {r["type"]: r for r in json.loads(result.stdout)}
    assert set(rows) == {n for n, c in EVENT_TYPES.items() if c.AGGREGATE == "container"}
    assert "gateway" in rows["ContainerRequested"]["appended_by"]
    assert "scheduler" in rows["ContainerRequested"]["consumed_by"]
    table = runner.invoke(app, ["contracts", "flow"])
    assert table.exit_code == 0 and "CheckpointDumped" in table.stdout and "WorkerDrained" in table.stdout
    assert runner.invoke(app, ["contracts", "flow", "-a", "nope"]).exit_code == 1
