"""Sandboxes end to end (levers9.Sandbox over /api/v1/sandboxes) on the lane's shared stack
(`shared_env`): a program's output streams before it ends and takes stdin; a missing program exits
127 with its error; files round trip under the workdir and a path or link out of it is refused; a
file over the limit is 413; another workspace gets 404; a snapshot restored into a new sandbox has
the first one's files and a process's memory, and two of the same options snapshot at once; `levers9
sandboxes list --json`; terminate."""

from __future__ import annotations

import asyncio
import json
import os
import tomllib
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from _e2e import api, bus_auth, cli, wait_until

from levers9.client import Client
from levers9.executor.sandbox_rules import MAX_FILE_BYTES
from levers9.sandbox import Sandbox, SandboxError

pytestmark = pytest.mark.slow

if os.geteuid() != 0:
    pytest.skip("sandboxes run in runc containers: root needed", allow_module_level=True)

# holds a value only in its memory; writes it to `answer` whenever `ask` appears
HOLDER = """import os, time
secret = os.urandom(8).hex()
while True:
    if os.path.exists("ask"):
        open("answer.tmp", "w").write(secret)
        os.rename("answer.tmp", "answer")
        os.remove("ask")
    time.sleep(0.05)
"""


def profile(env: dict) -> dict:
    return tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())


@pytest.fixture(scope="module")
def client(shared_env):
    p = profile(shared_env)
    with Client(p["gateway_url"], p["token"]) as c:
        yield c


@pytest.fixture(scope="module")
def sb(client):
    box = Sandbox.create(app="e2e", cpu=0.5, memory="256Mi", idle_timeout=300, env={"GREETING": "hi"}, client=client)
    yield box
    box.terminate()


def test_exec_streams_output_before_the_program_ends_and_takes_stdin(sb):
    p = sb.exec("python3", "-c", "import sys\nprint('ready')\nprint(input()[::-1])\nsys.exit(4)")
    lines = iter(p.stdout)
    assert next(lines) == "ready\n"
    assert p.poll() is None  # the first line came while the program waits on its stdin
    try:
        p.stdin.write("olleh\n")
    except SandboxError as exc:
        raise AssertionError(f"{exc}; the program's stderr: {p.stderr.read()!r}, exit {p.wait(30)}") from None
    p.stdin.close()
    assert list(lines) == ["hello\n"] and p.wait() == 4
    env = sb.exec("sh", "-c", "echo $GREETING from $(pwd)")
    assert env.stdout.read() == "hi from /sandbox\n" and env.wait() == 0


def test_a_missing_program_exits_127_with_its_error(sb):
    p = sb.exec("no-such-program", "--flag")
    assert p.wait() == 127 and "no-such-program: command not found" in p.stderr.read()


def test_an_exec_past_its_timeout_is_killed_and_a_bad_timeout_is_400(sb, shared_env):
    p = sb.exec("sh", "-c", "echo started; sleep 120", timeout=1)
    assert p.wait(timeout=60) == 124 and p.timed_out
    assert p.stdout.read() == "started\n" and "ran past its timeout of 1 s" in p.stderr.read()
    r = api(shared_env, "POST", f"/api/v1/sandboxes/{sb.id}/exec", json={"argv": ["true"], "timeout": "soon"})
    assert r.status_code == 400 and "timeout" in r.json()["detail"]


def test_files_round_trip_and_paths_out_of_the_root_are_refused(sb, shared_env):
    assert sb.files.write("data/a.bin", b"\x00\x01bytes") == 7
    assert sb.files.read("/sandbox/data/a.bin") == b"\x00\x01bytes"
    assert [e["name"] for e in sb.files.ls("data")] == ["a.bin"]
    assert sb.exec("cat", "data/a.bin").stdout.read() == "\x00\x01bytes"  # the programs see the same files
    sb.files.rm("data/a.bin")
    assert sb.files.ls("data") == []
    assert sb.exec("ln", "-s", "/etc", "etc-link").wait() == 0
    base = f"/api/v1/sandboxes/{sb.id}"
    for method, path in (("PUT", "../etc/x"), ("GET", "/etc/passwd"), ("GET", "a/../../etc/passwd"),
                         ("GET", "etc-link/passwd"), ("DELETE", "/sandbox/..")):
        r = api(shared_env, method, f"{base}/files", params={"path": path}, content=b"x" if method == "PUT" else None)
        assert r.status_code == 403 and "sandbox's root" in r.json()["detail"], (method, path, r.text)
    big = api(shared_env, "PUT", f"{base}/files", params={"path": "big"}, content=b"x" * (MAX_FILE_BYTES + 1))
    assert big.status_code == 413 and "limit" in big.json()["detail"]


def test_another_workspace_never_reaches_the_sandbox(sb, shared_env):
    from levers9.cli import publish_token

    nats = next(c["url"] for c in json.loads(cli(shared_env, "status", "--json").stdout)["components"]
                if c["name"] == "nats")
    token = "l9_" + uuid.uuid4().hex
    asyncio.run(publish_token(nats, token, "sandboxes", workspace="other", auth=bus_auth(shared_env)))
    url, headers = profile(shared_env)["gateway_url"], {"Authorization": f"Bearer {token}"}
    wait_until(lambda: httpx.get(f"{url}/api/v1/whoami", headers=headers, timeout=10).status_code == 200, timeout=60)
    for method, path, body in (("GET", "", None), ("POST", "/exec", {"argv": ["id"]}), ("GET", "/ls", None),
                               ("DELETE", "", None), ("POST", "/snapshot", None)):
        r = httpx.request(method, f"{url}/api/v1/sandboxes/{sb.id}{path}", headers=headers, json=body, timeout=60)
        assert r.status_code == 404 and "in workspace 'other'" in r.json()["detail"], (method, path, r.text)
    assert httpx.get(f"{url}/api/v1/sandboxes", headers=headers, timeout=60).json() == []
    assert api(shared_env, "GET", "/api/v1/sandboxes/nope").status_code == 404


def test_a_snapshot_restores_files_and_memory_in_a_new_sandbox_then_terminate(sb, client, shared_env):
    sb.files.write("holder.py", HOLDER)
    sb.files.write("note.txt", "written before the snapshot")
    assert sb.exec("sh", "-c", "setsid python3 holder.py </dev/null >/dev/null 2>&1 &").wait() == 0
    sb.files.write("ask", b"")
    secret = wait_until(lambda: ask_answer(sb), timeout=30)
    snap = sb.snapshot()
    restored = Sandbox.create(from_snapshot=snap, client=client)
    try:
        assert restored.files.read("note.txt") == b"written before the snapshot"
        restored.files.write("ask", b"")
        assert wait_until(lambda: ask_answer(restored), timeout=30) == secret  # the process's memory came along
        rows = json.loads(cli(shared_env, "sandboxes", "list", "--json").stdout)
        mine = {r["sandbox_id"]: r for r in rows}
        assert mine[sb.id]["status"] == mine[restored.id]["status"] == "running"
        assert mine[restored.id]["from_snapshot"] == snap.id
    finally:
        restored.terminate()
    wait_until(lambda: restored.status()["status"] == "terminated", timeout=60)
    with pytest.raises(Exception) as gone:
        restored.exec("true")
    assert "not running" in str(gone.value)
    replay = cli(shared_env, "events", "replay", "--type", "SandboxTerminated", "--json").stdout
    assert restored.id in replay


def test_two_sandboxes_of_the_same_options_snapshot_at_once(client):
    # same options, same deployment: the worker takes one dump per deployment at a time, and dropped
    # the second asked for (its caller waited 300 s for a 504); now it waits its turn
    twins = [Sandbox.create(app="e2e-twins", cpu=0.25, memory="128Mi", idle_timeout=120, client=client) for _ in range(2)]
    try:
        for i, box in enumerate(twins):
            box.files.write("who.txt", f"twin {i}")
        with ThreadPoolExecutor(2) as pool:
            snaps = list(pool.map(lambda box: box.snapshot(), twins))
        assert len({s.id for s in snaps}) == 2
        # the platform's deployment for these options is listed only when asked for
        assert not [d for d in client.list_deployments() if d["name"].startswith("sb-")]
        assert [d for d in client.list_deployments(sandboxes=True) if d["name"].startswith("sb-")]
        for i, snap in enumerate(snaps):
            restored = Sandbox.create(from_snapshot=snap, client=client)
            try:
                assert restored.files.read("who.txt") == f"twin {i}".encode()
            finally:
                restored.terminate()
    finally:
        for box in twins:
            box.terminate()


def ask_answer(sb: Sandbox) -> str:
    names = {e["name"] for e in sb.files.ls(".")}
    if "answer" not in names:
        return ""
    value = sb.files.read("answer").decode()
    sb.files.rm("answer")
    return value
