"""Boxes end to end (apps/box_app.py): a stock program (`python3 -m http.server`) answers through the
gateway at /box/NAME/ with its method, path and query, its requests are its log, and its second cold
start restores the checkpoint dumped once its port answered; a command that exits fails the call
with its exit code and its last log line; bad input (an unknown box, another workspace's box, a bad
port or an empty command at deploy) is refused with a sentence. On the lane's shared stack
(`shared_env`, tests/e2e/conftest.py)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
import tomllib
import uuid
from pathlib import Path

import httpx
import pytest
from _e2e import api, bus_auth, cli, wait_until

pytestmark = pytest.mark.slow

APPS = Path(__file__).parent / "apps"

if os.geteuid() != 0:
    pytest.skip("boxes run in runc containers: root needed", allow_module_level=True)


@pytest.fixture(scope="module")
def env(shared_env):
    cli(shared_env, "deploy", str(APPS / "box_app.py"))
    return shared_env


def gateway_url(env: dict) -> str:
    return tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())["gateway_url"]


def other_token(env: dict) -> str:
    """A token of workspace `other` (as tests/e2e/test_e2e_isolation.py makes one)."""
    from levers9.cli import publish_token

    nats = next(c["url"] for c in json.loads(cli(env, "status", "--json").stdout)["components"] if c["name"] == "nats")
    token = "l9_" + uuid.uuid4().hex
    asyncio.run(publish_token(nats, token, "boxes", workspace="other", auth=bus_auth(env)))
    wait_until(lambda: httpx.get(f"{gateway_url(env)}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"},
                                 timeout=10).status_code == 200, timeout=60)
    return token


def container(env, cid: str) -> dict:
    return api(env, "GET", f"/api/v1/containers/{cid}").json()


def gone(env, cid: str) -> bool:
    return container(env, cid)["status"] in ("stopped", "failed")


def checkpoints(env) -> list[dict]:
    return [c for c in api(env, "GET", "/api/v1/checkpoints", params={"all": "true"}).json()
            if c["deployment_id"].startswith("files-")]


def code_archive() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("box_app.py")
        tar.addfile(info, io.BytesIO(b""))
    return buf.getvalue()


def test_bad_input_is_refused_with_a_sentence(env):
    r = api(env, "GET", "/box/nope/x")
    assert r.status_code == 404 and "no box 'nope' in workspace 'default'" in r.json()["detail"]
    token = other_token(env)
    theirs = httpx.get(f"{gateway_url(env)}/box/files/", headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert theirs.status_code == 404 and "no box 'files' in workspace 'other'" in theirs.json()["detail"]
    box = {"name": "bad", "code": {"kind": "box", "module": "", "handler": ""}}
    for bad, field in (({"command": ["srv"], "port": 0}, "$.box.port"), ({"command": ["srv"], "port": 70000},
                                                                          "$.box.port"),
                       ({"command": [], "port": 8000}, "$.box.command")):
        r = api(env, "POST", "/api/v1/deployments", data={"spec": json.dumps({**box, "box": bad})},
                files={"code": ("code.tar.gz", code_archive(), "application/gzip")})
        assert r.status_code == 422 and field in r.json()["detail"], r.text


def test_a_stock_program_answers_through_the_gateway_and_restores_from_its_checkpoint(env):
    listing = api(env, "GET", "/box/files/")
    assert listing.status_code == 200 and "box_app.py" in listing.text, listing.text  # its cwd is /app
    cid = listing.headers["x-levers9-container-id"]
    page = api(env, "GET", "/box/files/box_app.py", params={"probe": "1"})
    assert page.status_code == 200 and 'app.box("files"' in page.text
    refused = api(env, "POST", "/box/files/", content=b"x")  # http.server has no POST: its own 501
    assert refused.status_code == 501 and refused.headers["x-levers9-container-id"] == cid
    # its stderr is its log: the request line as the program saw it, the query included
    wait_until(lambda: '"GET /box_app.py?probe=1 HTTP/1.1" 200' in cli(env, "boxes", "logs", "files").stdout)
    [row] = [b for b in json.loads(cli(env, "boxes", "list", "--json").stdout) if b["name"] == "files"]
    assert row["port"] == 8123 and row["command"] == "python3 -m http.server 8123"
    cold = container(env, cid)
    assert "no checkpoint" in cold["note"] and not cold["restored_from"]

    ck = wait_until(lambda: [c for c in checkpoints(env) if c["status"] == "available"], timeout=120)[0]
    assert ck["container_id"] == cid
    wait_until(lambda: gone(env, cid), timeout=60)  # idle past its keep-warm
    again = api(env, "GET", "/box/files/box_app.py")
    assert again.status_code == 200 and 'app.box("files"' in again.text
    restored = container(env, again.headers["x-levers9-container-id"])
    assert restored["container_id"] != cid and restored["restored_from"] == ck["checkpoint_id"], restored
    assert "restored from" in restored["note"] and restored["status"] == "ready"

    stopped = cli(env, "boxes", "stop", "files")
    assert "stopped box files" in stopped.stdout + stopped.stderr
    assert api(env, "GET", "/box/files/").status_code == 404


def test_a_command_that_exits_fails_the_call_with_its_exit_code_and_last_log_line(env):
    r = api(env, "GET", "/box/crashes/")
    assert r.status_code == 502, r.text
    detail = r.json()["detail"]
    assert "the box's command (sh) exited with status 3 before port 8000 answered" in detail, detail
    assert "cannot bind port 8000" in detail
    failed = [c for c in api(env, "GET", "/api/v1/containers", params={"all": "true"}).json()
              if c["deployment_id"].startswith("crashes-")]
    assert failed and failed[0]["status"] == "failed" and failed[0]["exit_code"] == 3
    assert "cannot bind port 8000" in cli(env, "boxes", "logs", "crashes").stdout
