"""Volumes and cloud buckets end to end, on real runc containers, JuiceFS and s3fs.

One stack for the module (`levers9 up`, two local workers of 2 cores each, so the writer and the
reader endpoint, 1.5 cores each, run on different workers: each worker mounts the same JuiceFS at its
own directory). The gateway has a mount of its own for `levers9 volumes put/get/ls/rm`.
"""

from __future__ import annotations

import asyncio
import json
import os
import tomllib
import uuid
from pathlib import Path

import botocore.session
import httpx
import pytest
from _e2e import cli, needs_runc, wait_until

needs_runc()
pytestmark = pytest.mark.slow

APPS = Path(__file__).parent / "apps"
BUCKET = "l9-volumes-test"


def call(env: dict, method: str, path: str, token: str | None = None, **kw) -> httpx.Response:
    profile = tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())
    return httpx.request(method, profile["gateway_url"] + path,
                         headers={"Authorization": f"Bearer {token or profile['token']}"},
                         timeout=kw.pop("timeout", 180), **kw)


def component_url(env: dict, name: str) -> str:
    status = json.loads(cli(env, "status", "--json").stdout)
    return next(c["url"] for c in status["components"] if c["name"] == name)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("l9volumes")
    pools = home / "pools.toml"
    pools.write_text('[pools.default]\nbackend = "local"\nmin_warm = 2\nmax_workers = 2\nidle_timeout_s = 600\n'
                     'worker_cpu_millicores = 2000\nworker_memory_mib = 2048\n')
    e = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    e.update(LEVERS9_HOME=str(home), LEVERS9_POOLS_FILE=str(pools), LEVERS9_WORKER_CPU_MILLICORES="2000",
             LEVERS9_WORKER_MEMORY_MIB="2048")
    try:
        cli(e, "up")
        wait_until(lambda: sum(w["status"] == "ready" and "runc" in w["features"]
                               for w in call(e, "GET", "/api/v1/workers").json()) >= 2, timeout=600)
        cli(e, "volumes", "create", "cache")
        yield e
    finally:
        cli(e, "down", check=False)


def test_volume_files_round_trip_through_the_cli(env, tmp_path):
    listed = json.loads(cli(env, "volumes", "list", "--json").stdout)
    assert [v["name"] for v in listed] == ["cache"]
    again = cli(env, "volumes", "create", "cache", check=False)
    assert again.returncode == 1 and "exists already" in again.stdout + again.stderr
    local = tmp_path / "model.bin"
    local.write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    cli(env, "volumes", "put", "cache", str(local), "models/model.bin")
    entries = json.loads(cli(env, "volumes", "ls", "cache", "models", "--json").stdout)
    assert [(e["path"], e["size"]) for e in entries] == [("models/model.bin", local.stat().st_size)]
    back = tmp_path / "back.bin"
    cli(env, "volumes", "get", "cache", "models/model.bin", str(back))
    assert back.read_bytes() == local.read_bytes()
    for bad in ("../../etc/passwd", "models/../../x"):
        refused = cli(env, "volumes", "get", "cache", bad, str(tmp_path / "x"), check=False)
        assert refused.returncode == 1 and "leaves the volume" in refused.stdout + refused.stderr, refused
    cli(env, "volumes", "rm", "cache", "models", "-r")
    assert json.loads(cli(env, "volumes", "ls", "cache", "--json").stdout) == []
    for bad in ("../x", "a/../../x"):  # the server refuses what the CLI would refuse too
        assert call(env, "GET", "/api/v1/volumes/cache/ls", params={"path": bad}).status_code == 400
    missing = cli(env, "volumes", "ls", "nope", check=False)
    assert missing.returncode == 1 and "no volume 'nope'" in missing.stdout + missing.stderr


def test_what_one_container_writes_the_next_reads_on_another_worker(env, tmp_path):
    note = tmp_path / "note.txt"
    note.write_text("put by the CLI")
    cli(env, "volumes", "put", "cache", str(note), "note.txt")
    cli(env, "deploy", str(APPS / "volumes_app.py"))
    text = f"written in a container {uuid.uuid4().hex}"
    w = call(env, "POST", "/endpoint/writer", json={"name": "shared.txt", "text": text})
    assert w.status_code == 200, w.text
    assert w.json()["read_back"] == text and "note.txt" in w.json()["files"]  # the CLI's put is in the container
    r = call(env, "POST", "/endpoint/reader", json={"name": "shared.txt"})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == text
    workers = {c["container_id"]: c["worker_id"] for c in call(env, "GET", "/api/v1/containers").json()}
    assert workers[w.json()["container_id"]] != workers[r.json()["container_id"]]  # two workers, one volume
    assert cli(env, "volumes", "get", "cache", "shared.txt").stdout == text  # and the gateway's mount


def test_another_workspace_sees_none_of_it(env):
    from levers9.cli import publish_token

    token = "l9_" + uuid.uuid4().hex
    os.environ["LEVERS9_HOME"], before = env["LEVERS9_HOME"], os.environ.get("LEVERS9_HOME")
    try:  # the CLI's NATS credentials come from the home
        asyncio.run(publish_token(component_url(env, "nats"), token, "volumes-test", workspace="other"))
    finally:
        os.environ.pop("LEVERS9_HOME") if before is None else os.environ.update(LEVERS9_HOME=before)
    wait_until(lambda: call(env, "GET", "/api/v1/whoami", token).status_code == 200, timeout=60)
    assert call(env, "GET", "/api/v1/volumes", token).json() == []
    for method, path in (("GET", "/api/v1/volumes/cache/ls"), ("GET", "/api/v1/volumes/cache/files/note.txt"),
                         ("PUT", "/api/v1/volumes/cache/files/x"), ("DELETE", "/api/v1/volumes/cache/files/note.txt"),
                         ("DELETE", "/api/v1/volumes/cache")):
        assert call(env, method, path, token).status_code == 404, (method, path)
    assert call(env, "POST", "/api/v1/volumes", token, json={"name": "cache"}).status_code == 201
    assert call(env, "GET", "/api/v1/volumes/cache/ls", token).json() == []  # its own, empty
    assert call(env, "GET", "/api/v1/volumes/cache/files/note.txt").status_code == 200  # ours is untouched


def test_a_cloud_bucket_is_read_and_written_through_s3fs(env):
    from levers9.runtime.config import Settings

    s = Settings.load(env={"LEVERS9_HOME": env["LEVERS9_HOME"]})
    s3 = botocore.session.get_session().create_client(
        "s3", endpoint_url=component_url(env, "s3"), region_name="us-east-1",
        aws_access_key_id=s.storage.s3_access_key, aws_secret_access_key=s.storage.s3_secret_key)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="in.txt", Body=b"from S3")
    assert call(env, "POST", "/api/v1/secrets", json={"name": "BUCKET_CREDS",
                                                        "value": f"{s.storage.s3_access_key}:{s.storage.s3_secret_key}"}).status_code == 201
    r = call(env, "POST", "/endpoint/bucket", json={"read": "in.txt", "write": "out.txt", "text": "from a container"})
    assert r.status_code == 200, r.text
    assert r.json()["read"] == "from S3" and "in.txt" in r.json()["listing"]
    assert s3.get_object(Bucket=BUCKET, Key="out.txt")["Body"].read() == b"from a container"

