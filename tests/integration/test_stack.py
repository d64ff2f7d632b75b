"""The embedded stack starts real NATS, Postgres and S3 servers, notices stale pid files, probes
health for real and leaves nothing running after `down`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import botocore.session
import nats
import psutil
import pytest

from levers9.runtime.config import Settings
from levers9.stack import Stack, StackError, free_port, procs
from levers9.stack.home import PROCESSES


def s3_client(endpoint: str, access_key: str, secret_key: str):
    # botocore is what boto3 wraps; it comes with aiobotocore, so it is always installed
    return botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        region_name="us-east-1")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def own_stack(tmp_path):
    """make(**env) -> (a Stack in this test's own home, the list its progress messages go to);
    whatever it started is stopped at the end, even when the test fails half-way."""
    made: list[Stack] = []

    def make(**env: str) -> tuple[Stack, list[str]]:
        made.append(Stack(tmp_path, Settings.load(env={"LEVERS9_HOME": str(tmp_path), **env})))
        return made[-1], []

    yield make
    for stack in made:
        stack.down()


def check_status(stack: Stack, urls: dict[str, str]) -> None:
    started = time.monotonic()
    comps = stack.status()
    assert time.monotonic() - started < 10  # no component's probe waits out a long timeout
    assert [c.name for c in comps] == ["nats", "postgres", "s3", "registry", *PROCESSES]
    by_name = {c.name: c for c in comps}
    assert by_name["nats"].url == urls["nats_url"]
    assert by_name["postgres"].url == urls["database_url"]
    assert by_name["s3"].url == urls["s3_endpoint"]
    assert by_name["registry"].url == urls["registry"]
    assert all(by_name[n].healthy and by_name[n].pid for n in ("nats", "postgres", "s3", "registry"))
    assert all(not by_name[n].healthy and by_name[n].detail == "not running" for n in PROCESSES)


def write_data(urls: dict[str, str], keys: dict[str, str]) -> None:
    s3 = s3_client(urls["s3_endpoint"], keys["s3_access_key"], keys["s3_secret_key"])
    s3.create_bucket(Bucket="kept")
    s3.put_object(Bucket="kept", Key="k", Body=b"kept")

    async def sql() -> None:
        conn = await asyncpg.connect(urls["database_url"])
        await conn.execute("CREATE TABLE kept (x int); INSERT INTO kept VALUES (1)")
        await conn.close()
    run(sql())


def read_data(urls: dict[str, str], keys: dict[str, str]) -> tuple[bytes, int]:
    s3 = s3_client(urls["s3_endpoint"], keys["s3_access_key"], keys["s3_secret_key"])
    body = s3.get_object(Bucket="kept", Key="k")["Body"].read()

    async def sql() -> int:
        conn = await asyncpg.connect(urls["database_url"])
        try:
            return await conn.fetchval("SELECT x FROM kept")
        finally:
            await conn.close()
    return body, run(sql())


def run(coro):
    """Run a coroutine from a sync test, on a loop of its own (pytest-asyncio keeps a session one)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def leftover(home: Path) -> list[int]:
    """Pids of live processes that mention `home` on their command line."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["status"] != psutil.STATUS_ZOMBIE and str(home) in cmdline:
            found.append(proc.pid)
    return found


async def js_works(url: str) -> bool:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().account_info()) is not None
    finally:
        await nc.close()


# ---- the shared servers work ---------------------------------------------------------------------

async def test_nats_has_jetstream(servers):
    nc = await nats.connect(servers["nats_url"])
    try:
        info = await nc.jetstream().account_info()
        assert info.limits is not None
    finally:
        await nc.close()


async def test_postgres_answers_on_database_levers9(servers):
    conn = await asyncpg.connect(servers["database_url"])
    try:
        assert await conn.fetchval("SELECT 1") == 1
        assert await conn.fetchval("SELECT current_database()") == "levers9"
    finally:
        await conn.close()


def test_s3_put_get_with_the_settings_keys(servers):
    s3 = s3_client(servers["s3_endpoint"], servers["s3_access_key"], servers["s3_secret_key"])
    bucket = f"test-{os.getpid()}-{time.monotonic_ns()}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="a/b.txt", Body=b"hello")
    assert s3.get_object(Bucket=bucket, Key="a/b.txt")["Body"].read() == b"hello"

    if os.environ.get("LEVERS9_S3_ENDPOINT"):
        return  # an external S3 may well allow more than our own does
    wrong = s3_client(servers["s3_endpoint"], "nobody", "wrong-secret")
    with pytest.raises(Exception, match="AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch"):
        wrong.get_object(Bucket=bucket, Key="a/b.txt")


# ---- a stack of its own: start, status, crash, stale pid files, down, restart --------------------

def test_lifecycle_keeps_data_and_leaves_nothing_running(tmp_path, own_stack):
    stack, said = own_stack()
    urls = stack.start_servers(said.append)
    assert set(urls) == {"nats_url", "database_url", "s3_endpoint", "registry"}
    state = json.loads((tmp_path / "state.json").read_text())
    pids = {name: state["components"][name]["pid"] for name in ("nats", "postgres", "s3", "registry")}
    assert all(alive(pid) for pid in pids.values())

    check_status(stack, urls)
    keys = stack.admin_credentials()
    write_data(urls, keys)

    said.clear()
    state = stack.up(services=(), progress=said.append)  # a second `up` starts nothing
    assert {k: state[k] for k in urls} == urls
    assert {name: state["components"][name]["pid"] for name in pids} == pids
    assert sum(": already running (pid" in m for m in said) == 4, said
    assert said[-1] == "everything is already running; nothing started"

    stack.down()
    assert not any(alive(pid) for pid in pids.values())
    assert not list((tmp_path / "run").glob("*.pid"))
    assert all(not c.healthy and c.detail == "not running" for c in stack.status())

    # stale pid files: one names a dead process, one an unrelated live process
    unrelated = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "run" / "nats.pid").write_text(f"{unrelated.pid}\n")
    (tmp_path / "run" / "postgres.pid").write_text(f"{dead.pid}\n")
    try:
        said.clear()
        urls2 = stack.start_servers(said.append)
        assert any("stale pid file" in m and str(unrelated.pid) in m for m in said), said
        assert any("stale pid file" in m and str(dead.pid) in m for m in said), said
        assert alive(unrelated.pid), "an unrelated process must never be signalled"
        new_nats = int((tmp_path / "run" / "nats.pid").read_text())
        assert new_nats != unrelated.pid and alive(new_nats)
        assert read_data(urls2, keys) == (b"kept", 1)  # same data, even though the ports changed
    finally:
        unrelated.kill()
        unrelated.wait()
        stack.down()
    assert not leftover(tmp_path)


def test_a_crashed_server_is_restarted_and_children_do_not_survive_down(tmp_path, servers, own_stack):
    # S3 external so that only NATS and Postgres start: this test is about processes, not data
    stack, said = own_stack(LEVERS9_S3_ENDPOINT=servers["s3_endpoint"])
    stack.start_servers()
    nats_pid = int((tmp_path / "run" / "nats.pid").read_text())
    postmaster = psutil.Process(int((tmp_path / "run" / "postgres.pid").read_text()))
    backends = [c.pid for c in postmaster.children(recursive=True)]
    assert backends, "postgres runs its checkpointer, walwriter, ... as children"

    os.kill(nats_pid, signal.SIGKILL)
    psutil.Process(nats_pid).wait(timeout=5)
    urls = stack.start_servers(said.append)
    assert any("stale pid file" in m and "gone" in m for m in said), said
    assert any(m.startswith("postgres: already running") for m in said), said
    assert int((tmp_path / "run" / "nats.pid").read_text()) != nats_pid
    assert run(js_works(urls["nats_url"]))

    stack.down()
    assert not any(alive(pid) for pid in [postmaster.pid, *backends])
    assert not leftover(tmp_path)


# ---- external servers and failures ----------------------------------------------------------------

def test_external_servers_are_used_not_started(tmp_path, servers, own_stack):
    stack, said = own_stack(LEVERS9_NATS_URL=servers["nats_url"],
                            LEVERS9_DATABASE_URL=servers["database_url"],
                            LEVERS9_S3_ENDPOINT=servers["s3_endpoint"],
                            LEVERS9_REGISTRY=servers["registry"])
    urls = stack.start_servers(said.append)
    assert urls == {k: servers[k] for k in ("nats_url", "database_url", "s3_endpoint", "registry")}
    assert sum("using external" in m for m in said) == 4
    assert not list((tmp_path / "run").glob("*.pid"))
    assert not (tmp_path / "nats").exists() and not (tmp_path / "postgres").exists()
    comps = {c.name: c for c in stack.status()}
    assert all(comps[n].healthy and comps[n].detail == "external" for n in ("nats", "postgres", "s3", "registry"))

    stack.down()  # must leave the external servers alone
    assert all(c.healthy for c in stack.status()[:4])


@pytest.fixture
def nats_handed_a_taken_port(servers, monkeypatch, own_stack):
    """start(times) starts the servers of a stack (with external Postgres and S3) whose NATS is handed
    a port another socket listens on the first `times` times it asks for its two (client, monitor);
    it returns what start_servers returned (or raised) and what it said."""
    stack, _ = own_stack(LEVERS9_DATABASE_URL=servers["database_url"],
                         LEVERS9_S3_ENDPOINT=servers["s3_endpoint"])
    stack.ready_timeout = 5
    real = procs.free_ports

    def start(times: int) -> tuple[dict[str, str] | StackError, list[str], int]:
        said: list[str] = []
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port, handed = taken.getsockname()[1], []

            def free_ports(n, host="127.0.0.1"):
                if n == 2 and len(handed) < times:
                    handed.append(port)
                    return [port, *real(1)]
                return real(n, host)
            monkeypatch.setattr(procs, "free_ports", free_ports)
            try:
                return stack.start_servers(said.append), said, port
            except StackError as err:
                return err, said, port

    return stack, start


def test_a_server_whose_port_was_taken_meanwhile_starts_again_on_new_ports(nats_handed_a_taken_port):
    stack, start = nats_handed_a_taken_port
    urls, said, taken = start(times=1)
    assert isinstance(urls, dict), urls
    assert procs.port_of(urls["nats_url"]) != taken
    assert sum("starting it again on new ports" in m for m in said) == 1, said
    assert {c.name: c.healthy for c in stack.status()}["nats"]
    stack.down()


def test_a_port_taken_twice_is_a_clear_error_and_nothing_stays_up(tmp_path, nats_handed_a_taken_port):
    _, start = nats_handed_a_taken_port
    err, said, _ = start(times=2)
    assert isinstance(err, StackError), err
    assert sum("starting it again on new ports" in m for m in said) == 1, said
    message = str(err)
    assert "nats did not start" in message
    assert str(tmp_path / "logs" / "nats.log") in message
    assert "address already in use" in message.lower()
    assert "levers9 up" in message
    assert not leftover(tmp_path)
    assert not (tmp_path / "run" / "nats.pid").exists()


# ---- services, with a stand-in for `python -m levers9 service NAME` --------------------------------

FAKE_SERVICE = r"""
import http.server, json, os, sys
if os.environ.get("FAKE_FAIL"):
    sys.exit("fake: cannot start because FAKE_FAIL is set")
with open(os.environ["FAKE_ENV_OUT"], "w") as f:
    json.dump(dict(os.environ), f)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["LEVERS9_HTTP_PORT"])), Health).serve_forever()
"""


def test_start_kill_stop_service(tmp_path, servers, own_stack):
    stack, _ = own_stack(LEVERS9_NATS_URL=servers["nats_url"],
                         LEVERS9_DATABASE_URL=servers["database_url"],
                         LEVERS9_S3_ENDPOINT=servers["s3_endpoint"])
    fake = [sys.executable, "-c", FAKE_SERVICE]
    env_out = tmp_path / "env.json"
    port = stack.start_service("worker", {"FAKE_ENV_OUT": str(env_out)}, command=fake)
    env = json.loads(env_out.read_text())
    assert env["LEVERS9_SERVICE"] == "worker" and env["LEVERS9_WORKER_ID"] == "local-1"
    assert env["LEVERS9_HTTP_PORT"] == str(port) and env["LEVERS9_HOME"] == str(tmp_path)
    assert env["LEVERS9_NATS_URL"] == servers["nats_url"]
    worker = {c.name: c for c in stack.status()}["worker"]
    assert worker.healthy and worker.url == f"http://127.0.0.1:{port}"

    stack.kill_service("worker")  # a crash: the pid file stays, status tells
    worker = {c.name: c for c in stack.status()}["worker"]
    assert not worker.healthy and "gone" in worker.detail
    assert (tmp_path / "run" / "worker.pid").exists()

    stack.start_service("worker", {"FAKE_ENV_OUT": str(env_out)}, command=fake)
    pid = int((tmp_path / "run" / "worker.pid").read_text())
    stack.stop_service("worker")
    assert not alive(pid) and not (tmp_path / "run" / "worker.pid").exists()

    with pytest.raises(StackError) as err:
        stack.start_service("gateway", {"FAKE_ENV_OUT": str(env_out), "FAKE_FAIL": "1"}, command=fake)
    assert "FAKE_FAIL is set" in str(err.value)
    assert str(tmp_path / "logs" / "gateway.log") in str(err.value)

    stack.start_service("worker", {"FAKE_ENV_OUT": str(env_out)}, command=fake)
    pid = int((tmp_path / "run" / "worker.pid").read_text())
    stack.down()
    assert not alive(pid)


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


# ---- credentials: generated per stack, one per role, an old home migrated ---------------------------

async def _as_role(dsn: str, own: str, other: str) -> tuple[bool, str]:
    """(whether the role is a superuser, what reading another service's schema gives)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {own}.mine (x int)")  # its own schema: allowed
        superuser = await conn.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        try:
            await conn.fetch(f"SELECT * FROM {other}.positions")
            return superuser, "read"
        except asyncpg.InsufficientPrivilegeError as exc:
            return superuser, str(exc)
    finally:
        await conn.close()


def test_each_role_gets_its_own_credentials_and_nothing_else(tmp_path, own_stack):
    from levers9.stack.credentials import credentials_dir

    stack, _ = own_stack()
    urls = stack.start_servers()
    hba = (tmp_path / "postgres" / "pg_hba.conf").read_text()
    assert "trust" not in hba and "scram-sha-256" in hba
    assert stat_mode(tmp_path) & 0o067 == 0 and stat_mode(credentials_dir(tmp_path)) == 0o700
    assert all(stat_mode(p) == 0o600 for p in credentials_dir(tmp_path).iterdir())
    assert stat_mode(tmp_path / "state.json") == 0o600

    fake = [sys.executable, "-c", FAKE_SERVICE]
    envs = {}
    for name in ("gateway", "pool-controller", "worker"):
        out = tmp_path / f"{name}.env.json"
        stack.start_service(name, {"FAKE_ENV_OUT": str(out)}, command=fake)
        envs[name] = json.loads(out.read_text())
    gateway, controller, worker = envs["gateway"], envs["pool-controller"], envs["worker"]
    assert gateway["LEVERS9_DATABASE_URL"] != urls["database_url"]  # not the admin's
    assert run(_as_role(gateway["LEVERS9_DATABASE_URL"], "gateway", "scheduler")) == \
        (False, "permission denied for schema scheduler")
    assert "LEVERS9_S3_SECRET_KEY" not in controller and "LEVERS9_WORKER_TOKEN" not in controller
    assert gateway["LEVERS9_S3_ACCESS_KEY"] != worker["LEVERS9_S3_ACCESS_KEY"]
    assert gateway["LEVERS9_S3_ACCESS_KEY"] != stack.admin_credentials()["s3_access_key"]
    # the controller's workers: the worker role's DSN, in a file it reads, never its own environment
    files = Path(controller["LEVERS9_WORKER_CREDENTIALS"])
    for name, registry in (("worker.json", False), ("worker-build.json", True)):
        given = json.loads((files / name).read_text())
        assert given["LEVERS9_DATABASE_URL"] == worker["LEVERS9_DATABASE_URL"]
        assert ("REGISTRY_AUTH_FILE" in given) == registry
    # S3: the worker's key reads, never writes a workspace's objects; the old fixed pair is refused
    keys = stack.admin_credentials()
    admin = s3_client(urls["s3_endpoint"], keys["s3_access_key"], keys["s3_secret_key"])
    admin.head_bucket(Bucket="levers9-volumes")  # made by the stack: a role's put cannot create a bucket
    admin.create_bucket(Bucket="levers9-ws")
    reader = s3_client(urls["s3_endpoint"], worker["LEVERS9_S3_ACCESS_KEY"], worker["LEVERS9_S3_SECRET_KEY"])
    reader.list_objects_v2(Bucket="levers9-ws")
    with pytest.raises(Exception, match="AccessDenied"):
        reader.put_object(Bucket="levers9-ws", Key="k", Body=b"x")
    with pytest.raises(Exception, match="InvalidAccessKeyId"):
        s3_client(urls["s3_endpoint"], "levers9", "levers9-secret").list_buckets()
    stack.down()


def test_an_old_home_is_migrated_on_up(tmp_path, own_stack):
    """A home from before generated credentials: trust in pg_hba.conf, tables the superuser's, no
    credentials; and a server still running that was started without them."""
    stack, said = own_stack()
    urls = stack.start_servers()

    async def age() -> None:  # what the old stack left: tables made by the superuser, no passwords
        conn = await asyncpg.connect(urls["database_url"])
        try:
            await conn.execute("CREATE TABLE scheduler.legacy (x int); ALTER SCHEMA scheduler OWNER TO postgres; "
                               "ALTER ROLE postgres PASSWORD NULL")
        finally:
            await conn.close()
    run(age())
    stack.down()
    shutil.rmtree(tmp_path / "credentials")
    (tmp_path / "postgres" / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")

    urls = stack.start_servers(said.append)
    assert any(m.startswith("postgres: roles configured") and "tables given" in m for m in said), said
    owner = run(_fetch(urls["database_url"], "SELECT tableowner FROM pg_tables WHERE tablename = 'legacy'"))
    assert owner == "levers9_scheduler"
    assert "trust" not in (tmp_path / "postgres" / "pg_hba.conf").read_text()

    # a server that runs from before (its state entry has no credentials): `up` restarts it
    state = json.loads((tmp_path / "state.json").read_text())
    old_pid = state["components"]["registry"]["pid"]
    del state["components"]["registry"]["auth"]
    (tmp_path / "state.json").write_text(json.dumps(state))
    said.clear()
    stack.start_servers(said.append)
    assert any("registry: pid" in m and "without this stack's credentials" in m for m in said), said
    assert not alive(old_pid)
    stack.down()


async def _fetch(dsn: str, sql: str):
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777
