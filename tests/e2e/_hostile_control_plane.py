"""Hostile-tenant cases: the control plane (collected through test_hostile_tenant.py, which holds the
stack `hostile_env`).

What a build step that reached the host's loopback did before: log into Postgres as superuser without a
password, read every token hash and insert one, push to the registry, use S3 with the fixed key pair.
Here each server is asked as such an intruder would, and must refuse:

- Postgres, as a local non-root user (`nobody`) without a password, over TCP and over the unix socket;
- Postgres with the gateway's own role: another service's tables are out of reach, and it is no superuser;
- the registry without credentials (a push, a catalogue read);
- S3 with the fixed pair every stack used to accept, and anonymously;
- the home and its secret files: nobody else may look inside;
- each service's environment (/proc/PID/environ) holds only its own role's credentials;
- the NATS monitor listens on loopback only.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import tempfile
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import botocore.session
import httpx
import psutil
import pytest
from _e2e import wait_until
from botocore.exceptions import ClientError

from levers9.runtime.config import SERVICES

# A Postgres startup message as any client sends it, in the system's python (run as `nobody`, who
# cannot read the project's venv): "ok" when the server lets it in without a password, "password"
# when it asks for one, the error or OSError otherwise.
PG_PROBE = r'''
import socket, struct, sys
kind, where, user = sys.argv[1], sys.argv[2], sys.argv[3]
def probe():
    try:
        if kind == "tcp":
            host, port = where.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=5)
        else:
            s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(where)
    except OSError as e:
        return f"refused: {type(e).__name__}"
    body = struct.pack("!I", 196608) + b"user\0" + user.encode() + b"\0database\0levers9\0\0"
    s.sendall(struct.pack("!I", len(body) + 4) + body)
    head = s.recv(5)
    if len(head) < 5:
        return "refused: closed"
    tag, size = head[:1], struct.unpack("!I", head[1:])[0]
    rest = s.recv(size - 4)
    if tag == b"R":
        code = struct.unpack("!I", rest[:4])[0]
        return "ok" if code == 0 else "password"
    return "refused: " + rest.decode(errors="replace").replace("\0", " ")[:200]
print(probe())
'''

FIXED_PAIR = ("levers9", "levers9-secret")  # what every stack accepted before keys were generated


def _home(env: dict) -> Path:
    return Path(env["LEVERS9_HOME"])


def _state(env: dict) -> dict:
    return json.loads((_home(env) / "state.json").read_text())


def _service_pids(env: dict) -> dict[str, int]:
    run = _home(env) / "run"
    return {name: int((run / f"{name}.pid").read_text().split()[0]) for name in SERVICES}


def _environ(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


def _as_nobody(*args: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".py", dir="/tmp", delete=False) as f:
        f.write(PG_PROBE)
    try:
        os.chmod(f.name, 0o644)
        out = subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/python3", f.name, *args],
                             capture_output=True, text=True, timeout=30)
        return (out.stdout + out.stderr).strip()
    finally:
        os.unlink(f.name)


def test_a_local_user_without_a_password_is_refused_by_postgres(hostile_env):
    from levers9.stack.postgres import socket_dir

    port = _state(hostile_env)["components"]["postgres"]["port"]
    sock = str(socket_dir(_home(hostile_env)) / f".s.PGSQL.{port}")
    tries = {(kind, user): _as_nobody(kind, where, user)
             for kind, where in (("tcp", f"127.0.0.1:{port}"), ("unix", sock))
             for user in ("postgres", "levers9_gateway", "nobody")}
    # the server was reachable (a password was asked for), and nobody got in without one
    assert tries[("tcp", "postgres")] == "password", tries
    assert all(result != "ok" for result in tries.values()), tries


def test_the_gateway_role_cannot_read_another_services_tables(hostile_env):
    dsn = _environ(_service_pids(hostile_env)["gateway"])["LEVERS9_DATABASE_URL"]
    assert urlsplit(dsn).username == "levers9_gateway"

    async def attempt() -> dict:
        conn = await asyncpg.connect(dsn)
        try:
            seen = {"own": await conn.fetchval("SELECT count(*) FROM gateway.tokens"),
                    "superuser": await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")}
            for table in ("scheduler.workers", "pool_controller.workers", "checkpoint_store.positions"):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.fetch(f"SELECT * FROM {table}")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("CREATE SCHEMA intruder")
            return seen
        finally:
            await conn.close()

    seen = asyncio.run(attempt())
    assert seen["own"] >= 1 and seen["superuser"] is False


def test_a_registry_push_without_credentials_is_refused(hostile_env):
    registry = _state(hostile_env)["components"]["registry"]["url"]
    with httpx.Client(base_url=f"http://{registry}", timeout=10, trust_env=False) as http:
        push = http.post("/v2/levers9/images/blobs/uploads/")
        catalogue = http.get("/v2/_catalog")
        wrong = http.post("/v2/levers9/images/blobs/uploads/", auth=("build", "guessed"))
    assert (push.status_code, catalogue.status_code, wrong.status_code) == (401, 401, 401)


def _s3(endpoint: str, key: str | None, secret: str | None):
    from botocore import UNSIGNED
    from botocore.config import Config

    config = Config(signature_version=UNSIGNED) if key is None else None
    return botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
        region_name="us-east-1", config=config)


def test_s3_refuses_the_old_fixed_keys_and_anonymous_requests(hostile_env):
    endpoint = _state(hostile_env)["s3_endpoint"]
    for key, secret in (FIXED_PAIR, (None, None)):
        client = _s3(endpoint, key, secret)
        with pytest.raises(ClientError):
            client.list_buckets()
        with pytest.raises(ClientError):
            client.put_object(Bucket="levers9-default", Key="code/poisoned.tar.gz", Body=b"x")
        with pytest.raises(ClientError):
            client.list_objects_v2(Bucket="levers9-default")


def test_the_home_and_its_secrets_are_private(hostile_env):
    home = _home(hostile_env)
    mode = stat.S_IMODE(home.stat().st_mode)
    assert mode & 0o007 == 0 and mode & 0o060 == 0, oct(mode)  # at most the postgres group may pass through
    secrets = [home / "config.toml", home / "state.json", home / "registry" / "htpasswd",
               home / "registry" / "config.yml", home / "run" / "s3-identities.json",
               *sorted((home / "credentials").iterdir())]
    profile = tomllib.loads((home / "config.toml").read_text())
    secrets.append(Path(profile["secret_key_file"]))
    assert stat.S_IMODE((home / "credentials").stat().st_mode) == 0o700
    loose = {str(p.relative_to(home) if home in p.parents else p.name): oct(stat.S_IMODE(p.stat().st_mode))
             for p in secrets if stat.S_IMODE(p.stat().st_mode) != 0o600}
    assert not loose, loose
    # and another local user cannot list it or read a log
    listing = subprocess.run(["runuser", "-u", "nobody", "--", "ls", str(home / "logs")], capture_output=True)
    reading = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(home / "logs" / "gateway.log")],
                             capture_output=True)
    assert listing.returncode != 0 and reading.returncode != 0 and not reading.stdout


def test_each_service_holds_only_its_roles_credentials(hostile_env):
    home = _home(hostile_env)
    profile = tomllib.loads((home / "config.toml").read_text())
    envs = {name: _environ(pid) for name, pid in _service_pids(hostile_env).items()}
    s3_users = {"gateway", "scheduler", "checkpoint-store", "image-builder", "worker"}
    for name, env in envs.items():
        user = urlsplit(env["LEVERS9_DATABASE_URL"]).username
        assert user == "levers9_" + name.replace("-", "_"), (name, user)
        assert ("LEVERS9_S3_SECRET_KEY" in env) == (name in s3_users), name
        assert env.get("LEVERS9_S3_ACCESS_KEY") != profile["s3_access_key"], f"{name} holds the admin's S3 key"
        assert ("LEVERS9_WORKER_TOKEN" in env) == (name == "worker"), name
        assert ("REGISTRY_AUTH_FILE" in env) == (name == "image-builder"), name
        assert "LEVERS9_TOKEN" not in env and profile["token"] not in "\0".join(env.values()), name
        assert ("LEVERS9_SECRET_KEY_FILE" in env) == (name in ("gateway", "checkpoint-store", "worker")), name
    keys = [envs[n]["LEVERS9_S3_ACCESS_KEY"] for n in sorted(s3_users)]
    assert len(set(keys)) == len(keys), "services share an S3 key"
    # the pool controller's own workers: the worker role, never the controller's credentials
    controller = envs["pool-controller"]
    own = _service_pids(hostile_env)["worker"]

    def started_workers() -> list[psutil.Process]:  # the build pool's warm worker comes a few seconds after up
        return [p for p in psutil.process_iter(["cmdline"]) if "worker" in (p.info["cmdline"] or [])
                and p.pid != own and _is_of(p, home)]
    started = wait_until(started_workers, timeout=180)
    for proc in started:
        env = proc.environ()
        assert urlsplit(env["LEVERS9_DATABASE_URL"]).username == "levers9_worker"
        assert env["LEVERS9_DATABASE_URL"] != controller["LEVERS9_DATABASE_URL"]
        assert env["LEVERS9_WORKER_TOKEN"] != envs["worker"]["LEVERS9_WORKER_TOKEN"]
        assert ("REGISTRY_AUTH_FILE" in env) == (env.get("LEVERS9_WORKER_POOL") == "build")


def _is_of(proc: psutil.Process, home: Path) -> bool:
    try:
        return proc.environ().get("LEVERS9_HOME") == str(home)
    except psutil.Error:
        return False


def test_the_nats_monitor_listens_on_loopback_only(hostile_env):
    entry = _state(hostile_env)["components"]["nats"]
    listening = {c.laddr for c in psutil.Process(entry["pid"]).net_connections("inet") if c.status == "LISTEN"}
    assert ("127.0.0.1", entry["monitor_port"]) in listening, listening
    assert all(addr.ip == "127.0.0.1" for addr in listening), listening
