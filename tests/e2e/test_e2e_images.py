"""Images end to end: a blueprint built for real (buildah on the build pool, pushed to the stack's
registry, archived to S3), deployed with the CLI and served from a lazy FUSE mount of its archive;
deploying it again reuses it; changing its last command rebuilds only that step; a bad package fails
the deploy with pip's own message.

One stack for the module, started by the real CLI (`levers9 up`) in a temporary LEVERS9_HOME."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _e2e import api, cli, wait_until

pytestmark = pytest.mark.slow

APPS = Path(__file__).parent / "apps"

if os.geteuid() != 0 or not any(Path(p, "runc").exists() for p in os.environ.get("PATH", "").split(":")):
    pytest.skip("runc containers need root and runc (scripts/setup.sh installs runc)", allow_module_level=True)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("l9images")
    e = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    e.update(LEVERS9_HOME=str(home))
    try:
        cli(e, "up")
        wait_until(lambda: any(w["status"] == "ready" and w.get("pool") == "build"
                               for w in api(e, "GET", "/api/v1/workers").json()), timeout=600)
        yield e
    finally:
        cli(e, "down", check=False)


def fuse_mounts() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if " - fuse" in line and "levers9-im-" in line]


@pytest.fixture(scope="module")
def built(env):
    started = time.monotonic()
    out = cli(env, "deploy", str(APPS / "imaged.py"))
    return {"output": out.stdout + out.stderr, "seconds": time.monotonic() - started}


def test_the_image_is_built_and_the_endpoint_answers_with_its_package_command_and_env(env, built):
    assert re.search(r"im-[0-9a-f]{24}", built["output"]), built["output"]
    r = api(env, "POST", "/endpoint/imaged", json={})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["size"] == "3.0 MB"  # humanize, which the base does not have
    assert body["marker"] == "built-by-levers9" and body["last"] == "first"
    assert body["greeting"] == "hello from the image"
    # while its container runs, its image is a FUSE mount on the worker
    mounts = fuse_mounts()
    assert mounts, "no levers9 FUSE mount while the container runs"
    images = json.loads(cli(env, "images", "list", "--json").stdout)
    built_ids = [i["image_id"] for i in images if i["status"] == "built"]
    assert any(i in "".join(mounts) for i in built_ids), (mounts, images)


def test_the_same_blueprint_again_uses_the_cached_image_in_seconds(env, built):
    out = cli(env, "deploy", str(APPS / "imaged.py"))
    assert "using cached image" in out.stdout + out.stderr  # how long it takes: bench/, not a test


def test_changing_the_last_command_rebuilds_only_that_step(env, built):
    e = {**env, "IMAGED_LAST_COMMAND": "echo second > /srv/imaged/last"}
    out = cli(e, "deploy", str(APPS / "imaged.py"))
    text = out.stdout + out.stderr
    image_id = re.findall(r"im-[0-9a-f]{24}", text)[0]
    detail = api(env, "GET", f"/api/v1/images/{image_id}").json()
    states = [s["state"] for s in detail["steps"]]
    assert states[:-1] == ["cached"] * (len(states) - 1) and states[-1] == "done", detail
    wait_until(lambda: api(env, "POST", "/endpoint/imaged", json={}).json().get("last") == "second", timeout=120)


def test_an_unknown_package_fails_the_deploy_with_pips_message(env):
    out = cli(env, "deploy", str(APPS / "bad_image.py"), check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "levers9-no-such-package-xyz" in text and ("No matching distribution" in text or "ERROR" in text), text
    assert api(env, "POST", "/endpoint/bad-image", json={}).status_code == 404


def test_the_registry_serves_the_built_image_to_skopeo(env, built):
    images = [i for i in json.loads(cli(env, "images", "list", "--json").stdout) if i["status"] == "built"]
    detail = api(env, "GET", f"/api/v1/images/{images[0]['image_id']}").json()
    status = {c["name"]: c for c in json.loads(cli(env, "status", "--json").stdout)["components"]}
    assert status["registry"]["healthy"], status["registry"]
    assert detail["registry"] and detail["reference"] == f"levers9/images:{images[0]['image_id']}", detail
    # the registry wants a password (the home's admin's, as any client with its credentials)
    auth = Path(env["LEVERS9_HOME"]) / "credentials" / "registry-admin.json"
    config = subprocess.run(["skopeo", "inspect", "--config", "--tls-verify=false", "--authfile", str(auth),
                             f"docker://{detail['registry']}/{detail['reference']}"], capture_output=True, text=True)
    assert config.returncode == 0, config.stderr
    assert "GREETING=hello from the image" in config.stdout


def test_two_requests_for_one_new_blueprint_at_once_build_it_once(env, built):
    blueprint = {"commands": [f"echo {uuid.uuid4().hex} > /srv/concurrent"]}
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: api(env, "POST", "/api/v1/images", json={"blueprint": blueprint}), range(4)))
    assert all(a.status_code in (200, 202) for a in answers), [a.text for a in answers]
    image_id = answers[0].json()["image_id"]
    assert {a.json()["image_id"] for a in answers} == {image_id}
    wait_until(lambda: api(env, "GET", f"/api/v1/images/{image_id}").json()["status"] in ("built", "failed"),
               timeout=300, every=0.5)
    events = [json.loads(line) for line in cli(env, "events", "replay", "--json", "--aggregate", "image",
                                               "--aggregate-id", image_id).stdout.splitlines() if line.strip()]
    types = [e["type"] for e in events]
    assert types.count("ImageBuildRequested") == 1 and types.count("ImageBuildStarted") == 1, types
    assert types[-1] == "ImageBuilt", types
