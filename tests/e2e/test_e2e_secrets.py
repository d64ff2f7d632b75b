"""A canary secret appears nowhere in clear. On the lane's shared `levers9 up` stack (`shared_env`):
a secret with a random value is set, endpoints and a function that use it are called (they answer its
sha256, never the value), a container is checkpointed, restored from S3 and later refused a restore
under a retired key, an error path is provoked, the key is rotated (old values still open), then
rewrapped and the old key retired. Then the canary is looked for in the raw bytes of everything the
stack keeps under its home (the NATS store with the LEVERS9 stream and its DLQ, every service log,
PostgreSQL's files, S3's files), in a dump of every PostgreSQL table of every schema, in every S3
object, and in every CLI output: 0 hits. Positive controls prove the search finds it where it
legitimately is: the container's config.json on the worker's disk and the node cache's (plaintext)
copy of the checkpoint."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from _e2e import api, cli, needs_runc, wait_until

pytestmark = pytest.mark.slow
needs_runc()

APPS = Path(__file__).parent / "apps"
CANARY = f"l9canary-{uuid.uuid4().hex}"
NEEDLES = [CANARY.encode(), base64.b64encode(CANARY.encode())[:40], CANARY.encode().hex().encode()]
BLOBS = Path("/var/cache/levers9/blobs")


@pytest.fixture(scope="module")
def env(shared_env):
    return shared_env


def has_criu(env) -> bool:
    return any("criu" in w["features"] for w in api(env, "GET", "/api/v1/workers").json())


def call(env, name: str, outputs: list[str]) -> dict:
    r = api(env, "POST", f"/endpoint/{name}", json={})
    outputs.append(r.text)
    assert r.status_code == 200, r.text
    assert r.json()["sha256"] == hashlib.sha256(CANARY.encode()).hexdigest()
    return {**r.json(), "container_id": r.headers["x-levers9-container-id"]}


def container(env, cid: str) -> dict:
    return api(env, "GET", f"/api/v1/containers/{cid}").json()


def stop(env, cid: str, outputs: list[str]) -> None:
    outputs.append(cli(env, "containers", "stop", cid).stdout)
    wait_until(lambda: container(env, cid)["status"] in ("stopped", "failed"), timeout=60)


def hits(root: Path, skip: tuple[Path, ...] = ()) -> list[str]:
    """Files under root holding the canary (raw bytes, or its base64 or hex), read in overlapping blocks."""
    found = []
    for top, dirs, files in os.walk(root):  # errors (a dir going away) are skipped
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(top, d))
                   and not any(Path(top, d).is_relative_to(s) for s in skip)]
        found += [str(Path(top, f)) for f in files if _holds(Path(top, f))]
    return found


def _holds(path: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with path.open("rb") as f:
            tail = b""
            while block := f.read(8 << 20):
                if any(n in tail + block for n in NEEDLES):
                    return True
                tail = block[-200:]
    except OSError:
        pass  # a file that went away while we walked
    return False


async def postgres_dump(database_url: str) -> bytes:
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        tables = await conn.fetch("SELECT table_schema, table_name FROM information_schema.tables WHERE "
                                  "table_schema NOT IN ('pg_catalog', 'information_schema') AND table_type='BASE TABLE'")
        out = bytearray()
        for t in tables:
            rows = await conn.fetch(f'SELECT t::text AS row FROM "{t[0]}"."{t[1]}" t')
            out += f"-- {t[0]}.{t[1]}: {len(rows)}\n".encode() + b"\n".join(r["row"].encode() for r in rows)
        assert len(tables) > 10, f"expected the services' tables, got {tables}"
        return bytes(out)
    finally:
        await conn.close()


async def s3_objects(endpoint: str, home: str) -> dict[str, bytes]:
    from aiobotocore.session import get_session

    from levers9.runtime.config import Settings

    s = Settings.load(env={"LEVERS9_HOME": home})  # the profile's S3 keys: the stack's admin's
    out = {}
    async with get_session().create_client("s3", endpoint_url=endpoint, aws_access_key_id=s.storage.s3_access_key,
                                           aws_secret_access_key=s.storage.s3_secret_key, region_name=s.storage.s3_region) as c:
        for b in (await c.list_buckets())["Buckets"]:
            async for page in c.get_paginator("list_objects_v2").paginate(Bucket=b["Name"]):
                for o in page.get("Contents", []):
                    out[f"{b['Name']}/{o['Key']}"] = await (await c.get_object(Bucket=b["Name"], Key=o["Key"]))["Body"].read()
    return out


def test_a_canary_secret_appears_nowhere_in_clear(env):
    home = Path(env["LEVERS9_HOME"])
    outputs: list[str] = []
    # the value goes in on stdin (`-`), as a user should pass one
    proc = subprocess.run([sys.executable, "-m", "levers9", "secret", "create", "L9_CANARY", "-"], env=env,
                          input=CANARY, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    outputs += [proc.stdout, proc.stderr, cli(env, "deploy", str(APPS / "secret_probe.py")).stdout]

    # a plain container: its config.json on the worker's disk holds the value (the positive control)
    plain = call(env, "secret-plain", outputs)
    workers_dir = home / "workers"
    assert {oct(d.stat().st_mode & 0o777) for d in workers_dir.iterdir() if d.is_dir()} == {"0o700"}
    assert [c for c in workers_dir.glob("*/containers/*/config.json") if _holds(c)], \
        "the search must find the canary on the worker's disk"
    stop(env, plain["container_id"], outputs)
    r = api(env, "POST", "/function/secrets/fingerprint", json={})  # a function's sandbox gets it too
    outputs.append(r.text)
    assert r.status_code == 200 and r.json()["result"] == hashlib.sha256(CANARY.encode()).hexdigest(), r.text

    ck = None
    if has_criu(env):  # checkpoint (sealed into S3), restore from S3 (opened on the worker)
        first = call(env, "secret-probe", outputs)
        # this container's own checkpoint: the shared stack may list others' (their deployments are gone)
        ck = wait_until(lambda: [c for c in api(env, "GET", "/api/v1/checkpoints", params={"all": "true"}).json()
                                 if c["status"] == "available" and c["container_id"] == first["container_id"]],
                        timeout=180)[0]
        blob = BLOBS / ck["sha256"]
        assert CANARY.encode() in blob.read_bytes(), "a dump holds the container's environment in clear"
        wait_until(lambda: container(env, first["container_id"])["status"] in ("stopped", "failed"), timeout=60)
        blob.unlink()  # the next restore fills from S3: the sealed archive is opened on the worker
        second = call(env, "secret-probe", outputs)
        assert container(env, second["container_id"])["restored_from"] == ck["checkpoint_id"]
        wait_until(lambda: container(env, second["container_id"])["status"] in ("stopped", "failed"), timeout=60)

    # error paths: a secret nobody set; a refused request that carries the value
    r = api(env, "POST", "/endpoint/secret-missing", json={}, timeout=120)
    outputs.append(r.text)
    assert r.status_code >= 400, r.text
    r = api(env, "POST", "/api/v1/secrets", json={"name": "bad name", "value": CANARY})
    assert r.status_code == 422 and CANARY not in r.text
    outputs.append(cli(env, "secret", "create", "bad name", CANARY, check=False).stderr)

    # rotation: old values still open; rewrap and retire the old key: they still open
    outputs.append(cli(env, "secret", "rotate-key").stderr)
    after_rotate = call(env, "secret-plain", outputs)
    stop(env, after_rotate["container_id"], outputs)
    rewrap = cli(env, "secret", "rotate-key", "--rewrap", "--retire-old").stderr
    outputs.append(rewrap)
    assert "rewrapped 1 of 1" in rewrap and "retired key" in rewrap, rewrap
    keys = api(env, "GET", "/api/v1/secrets/keys").json()
    assert list(keys["by_key"]) == [keys["primary"]] and len(keys["keys"]) == 1
    after_retire = call(env, "secret-plain", outputs)
    stop(env, after_retire["container_id"], outputs)
    if ck:  # the checkpoint was sealed under the retired key: its restore fails clearly, cold start instead
        wait_until(lambda: not any(c["status"] == "ready" for c in api(env, "GET", "/api/v1/containers").json()),
                   timeout=60)
        BLOBS.joinpath(ck["sha256"]).unlink(missing_ok=True)
        cold = call(env, "secret-probe", outputs)
        assert "does not hold" in container(env, cold["container_id"])["note"]

    for args in (("containers", "list", "--all", "--json"), ("events", "replay", "--json"),
                 ("checkpoints", "list", "--json"), ("secret", "list", "--json"), ("status", "--json")):
        run = cli(env, *args)
        outputs += [run.stdout, run.stderr]
    for c in json.loads(cli(env, "containers", "list", "--all", "--json").stdout):
        outputs.append(cli(env, "containers", "logs", c["container_id"], check=False).stdout)

    # positive control of the search itself: a file holding the value under the scanned tree
    control = home / "logs" / "canary-control.txt"
    control.write_text(CANARY)
    assert hits(home, skip=(workers_dir,)) == [str(control)]
    control.unlink()

    failed = [c for c in json.loads(cli(env, "containers", "list", "--all", "--json").stdout)
              if c["status"] == "failed" and "L9_NOT_SET" in c.get("reason", "") + c.get("note", "")]
    assert failed, "the container that needs a missing secret failed, and says which"

    assert not [o for o in outputs if any(n.decode() in o for n in NEEDLES)], "a CLI or HTTP output shows the value"
    state = json.loads((home / "state.json").read_text())
    assert not any(n in asyncio.run(postgres_dump(state["database_url"])) for n in NEEDLES)
    objects = asyncio.run(s3_objects(state["s3_endpoint"], str(home)))
    assert not [k for k, v in objects.items() if any(n in v for n in NEEDLES)]
    if ck:
        assert any(k.endswith(f"{ck['checkpoint_id']}.tar") for k in objects), "the checkpoint is in S3 (sealed)"
    cli(env, "down")  # the servers stopped, their files are complete on disk: NATS's store, logs, PG, S3
    leaks = hits(home, skip=(workers_dir,))
    assert leaks == [], f"the canary is in clear in {leaks}"
