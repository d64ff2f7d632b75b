"""Shared pre-import checkpoints end to end: `levers9 catalogue build` for real on a small corpus
(analysis, measurement and capture in sandboxes of the flavor's image, publish), the scheduler
routing a function's sandboxes to the shared checkpoint (four restored at once, each drawing its
own random numbers), the choice in the log, and a worker dropping a checkpoint captured with other
sandbox settings.

One stack for the module, started by the real CLI (`levers9 up`) in a temporary LEVERS9_HOME."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _e2e import api, cli, needs_runc, one_worker_stack, wait_until

pytestmark = pytest.mark.slow

APPS = Path(__file__).parent / "apps"

needs_runc()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with one_worker_stack(tmp_path_factory.mktemp("l9catalogue"), 6000, 8192) as e:
        if not any("criu" in w["features"] for w in api(e, "GET", "/api/v1/workers").json()):
            pytest.skip("no worker here can checkpoint (CRIU)")
        yield e


@pytest.fixture(scope="module")
def built(env, tmp_path_factory):
    work = tmp_path_factory.mktemp("catalogue-work")
    out = cli(env, "catalogue", "build", "--no-default-corpus", "--corpus", str(APPS / "corpus"), "--top", "3",
              "--max-checkpoints", "2", "--work-dir", str(work), "--json").stdout
    return json.loads(out.strip().splitlines()[-1]), work


def events(env: dict, *args: str) -> list[dict]:
    out = cli(env, "events", "replay", *args, "--json").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def run(env: dict, *args: str) -> list:
    proc = subprocess.run([sys.executable, str(APPS / "fn_numpy.py"), *args], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])


def test_the_pipeline_builds_publishes_and_resumes_a_catalogue(env, built):
    result, work = built
    for stage in ("corpus", "analysis", "measurements", "groups", "capture", "catalogue"):
        assert (work / f"{stage}.json").exists()
    shown = json.loads(cli(env, "catalogue", "show", "--json").stdout)
    assert shown["catalogue_id"] == result["catalogue_id"] and shown["corpus"]
    [checkpoint] = shown["checkpoints"][:1]
    held = {p["distribution"] for p in checkpoint["packages"]}
    assert "numpy" in held and checkpoint["restore_seconds"] > 0 and checkpoint["executor_generation"] == 1
    assert checkpoint["settings"]["python"] and all(p["import_seconds"] > 0 for p in checkpoint["packages"])
    assert {"greedy", "one_with_everything", "none"} <= set(result["scores"])
    written = {p.name: p.stat().st_mtime_ns for p in work.glob("*.json")}
    cli(env, "catalogue", "build", "--no-default-corpus", "--corpus", str(APPS / "corpus"), "--top", "3",
        "--max-checkpoints", "2", "--work-dir", str(work), "--no-publish")
    assert {p.name: p.stat().st_mtime_ns for p in work.glob("*.json")} == written  # resumed: nothing redone
    checked = wait_until(lambda: [e for e in events(env, "--type", "WorkerCatalogueChecked")
                                  if e["data"]["catalogue_id"] == result["catalogue_id"]], timeout=60)
    assert checkpoint["checkpoint_id"] in checked[0]["data"]["restorable"]


def test_four_sandboxes_restore_the_shared_checkpoint_at_once_with_their_own_randomness(env, built):
    results = run(env, "on", "4")
    assert [r[0] for r in results] == [0, 1, 2, 3]
    assert len({r[2] for r in results}) == 4 and len({r[3] for r in results}) == 4  # reseeded after each restore
    scheduled = [e for e in events(env, "--type", "ContainerScheduled")
                 if (e["data"].get("spec") or {}).get("app_name") == "fnnumpy"]
    shared = [e for e in scheduled if e["data"]["note"].startswith("shared checkpoint")]
    assert len(shared) >= 4, [e["data"]["note"] for e in scheduled]
    choice = shared[0]["data"]["choice"]
    assert choice["chosen"]["candidate"].startswith("shared:") and choice["runner_up"]["candidate"] == "cold"
    assert choice["chosen"]["seconds"] < choice["runner_up"]["seconds"]


def test_without_shared_checkpoints_the_function_starts_cold(env, built):
    run(env, "off", "1")
    scheduled = [e for e in events(env, "--type", "ContainerScheduled")
                 if (e["data"].get("spec") or {}).get("app_name") == "fnnumpy"
                 and not ((e["data"]["spec"].get("function") or {}).get("shared_checkpoints", True))]
    assert scheduled and all(not e["data"]["note"].startswith("shared") for e in scheduled)


def test_a_worker_drops_a_checkpoint_captured_with_other_settings_and_says_why(env, built):
    shown = json.loads(cli(env, "catalogue", "show", "--json").stdout)
    other = dict(shown["checkpoints"][0])
    other["settings"] = {**other["settings"], "python": "3.99", "cpu_features": ["avx512_fake"]}
    doc = {**shown, "catalogue_id": "01ffffff-0000-7000-8000-000000000000", "checkpoints": [other]}
    r = api(env, "POST", "/api/v1/catalogues", json=doc)
    assert r.status_code == 201, r.text
    checked = wait_until(lambda: [e for e in events(env, "--type", "WorkerCatalogueChecked")
                                  if e["data"]["catalogue_id"] == doc["catalogue_id"]], timeout=60)
    why = checked[0]["data"]["dropped"][other["checkpoint_id"]]
    assert checked[0]["data"]["restorable"] == [] and "3.99" in why and "avx512_fake" in why
