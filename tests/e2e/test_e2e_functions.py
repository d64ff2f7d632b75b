"""Python functions end to end on real runc sandboxes: a user's script calling functions defined
in its __main__ with no deploy step, a deployed function over REST and the CLI, a sandbox that dies
mid-call, cancelling, and the call log.

The lane's shared stack (`shared_env`, tests/e2e/conftest.py), reset for the module."""

from __future__ import annotations

import asyncio
import datetime
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _e2e import api, cli, needs_runc, wait_until

pytestmark = pytest.mark.slow

APPS = Path(__file__).parent / "apps"

needs_runc()


@pytest.fixture(scope="module")
def env(shared_env):
    return shared_env


def script(env: dict, path: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(path), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=path.parent)


def test_a_script_calls_functions_of_its_main_in_real_sandboxes(env):
    proc = script(env, APPS / "fn_script.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    seen = json.loads(line[len("RESULT "):])
    assert seen["remote"] == 21  # helper() and FACTOR came along by value
    assert seen["map"] == [9, 4, 1]  # input order, though the last finished first
    assert seen["error"] == {"type": "Oops", "own_type": True, "message": "bad input 5", "remote_frame": True}
    assert seen["spawn"] == 81 and seen["from_id"] == 81
    assert seen["gen"] == ["A", "REMOTE", "GENERATOR"]
    assert seen["session"] == [1, 2, 3]  # one sandbox, its globals kept
    assert seen["no_session"] == 1
    assert "scaling 7" in proc.stdout  # the function's print reached the caller's stdout


def test_each_call_is_in_the_log_without_its_arguments(env):
    out = cli(env, "events", "replay", "--aggregate", "call", "--json").stdout
    events = [json.loads(ln) for ln in out.splitlines() if ln.strip()]
    started = [e for e in events if e["type"] == "FunctionCallStarted"]
    finished = [e for e in events if e["type"] == "FunctionCallFinished"]
    assert started and finished
    assert {e["data"]["outcome"] for e in finished} >= {"ok", "error"}
    assert all(e["data"]["token_id"] for e in started)
    assert "bad input" not in out  # the exception's message is a result: never in the log


@pytest.fixture(scope="module")
def stats(env):
    cli(env, "deploy", str(APPS / "fn_stats.py"))
    return env


def test_a_deployed_function_answers_over_rest_python_and_the_cli(stats):
    r = api(stats, "POST", "/function/stats/zscore", json={"xs": [1, 2, 3]})
    assert r.status_code == 200, r.text
    assert r.json()["result"] == [-1.225, 0.0, 1.225] and r.json()["output"] == "mean 2.0\n"
    code = ("from levers9 import Function\n"
            "print(Function.lookup('stats', 'zscore').remote([2, 4]))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=stats, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "[-1.0, 1.0]" in proc.stdout, proc.stdout + proc.stderr
    ran = cli(stats, "run", f"{APPS / 'fn_stats.py'}::zscore", "[10, 20]")
    assert "[-1.0, 1.0]" in ran.stdout
    missing = api(stats, "POST", "/function/stats/nope", json={})
    assert missing.status_code == 404 and "levers9 deploy" in missing.json()["detail"]
    assert api(stats, "POST", "/function/stats/zscore", content=b"[1]").status_code == 422


def test_a_sandbox_killed_mid_call_fails_the_call_with_why_after_its_retries(stats):
    r = api(stats, "POST", "/function/stats/hog", json={"args": [400]})
    assert r.status_code == 502, r.text
    body = r.json()
    assert "out of memory" in body["detail"] and body["attempts"] == 2  # retries=1: tried again, then failed
    assert "retrying" in body["output"]


def ran_seconds(env: dict, correlation_id: str) -> float:
    """How long a call ran in its sandbox: its FunctionCallStarted (sent once it had a sandbox) to its
    FunctionCallFinished. A cold start before it, slow on a loaded machine, is not the call's time
    (CI: 48 s from request to 504, the sandbox started for it after the previous test's OOM)."""
    def both() -> dict[str, str] | None:
        out = cli(env, "events", "replay", "--correlation-id", correlation_id, "--json").stdout
        times = {e["type"]: e["occurred_at"] for e in map(json.loads, filter(str.strip, out.splitlines()))
                 if e["type"] in ("FunctionCallStarted", "FunctionCallFinished")}
        return times if len(times) == 2 else None
    times = wait_until(both, timeout=60)
    at = {k: datetime.datetime.fromisoformat(v.replace("Z", "+00:00")) for k, v in times.items()}
    return (at["FunctionCallFinished"] - at["FunctionCallStarted"]).total_seconds()


def test_a_call_past_its_timeout_is_stopped_and_says_so(stats):
    r = api(stats, "POST", "/function/stats/sleepy", json={"args": [30]})
    assert r.status_code == 504 and "timed out after 2 s" in r.json()["detail"]
    assert ran_seconds(stats, r.json()["correlation_id"]) < 15  # stopped at its 2 s, not after its 30 s sleep
    assert api(stats, "POST", "/function/stats/sleepy", json={"args": [0]}).json()["result"] == 0  # slot freed


def as_from_a_terminal() -> None:
    """The caller gets SIGINT as a shell's child does: a pytest-xdist lane may block or ignore it, and
    a child inherits both (seen: the caller never saw Ctrl-C and went on waiting for its result)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_the_caller_cancels_the_remote_call_and_frees_its_slot(env):
    path = APPS / "fn_cancel.py"
    # -X faulthandler: a caller that does not end after Ctrl-C shows where each of its threads waits
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", str(path), "long"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=path.parent,
                            preexec_fn=as_from_a_terminal)
    assert proc.stdout is not None
    wait_until(lambda: "napping" in proc.stdout.readline(), timeout=300, every=0)
    proc.send_signal(signal.SIGINT)
    try:
        out = proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        raise AssertionError("the caller did not end after Ctrl-C:\n" + proc.communicate(timeout=30)[0]) from None
    assert proc.returncode != 0 and "KeyboardInterrupt" in out, out
    # max_containers=1: the short call runs only once the long one's slot came back (else it would wait
    # for the long call's 600 s)
    short = script(env, path, "short", timeout=120)
    assert short.returncode == 0 and "RESULT 0" in short.stdout, short.stdout + short.stderr
    log = cli(env, "events", "replay", "--aggregate", "call", "--type", "FunctionCallFinished", "--json").stdout
    assert any(json.loads(ln)["data"]["outcome"] == "cancelled" for ln in log.splitlines() if ln.strip())


def test_a_checkpointed_function_restores_its_sandbox_on_the_next_cold_start(env):
    if not any("criu" in w["features"] for w in api(env, "GET", "/api/v1/workers").json()):
        pytest.skip("no worker here can checkpoint (CRIU)")
    path = APPS / "fn_ckpt.py"
    listed = lambda: json.loads(cli(env, "checkpoints", "list", "--json").stdout)  # noqa: E731
    before = {c["checkpoint_id"] for c in listed()}  # on the shared stack, earlier modules' may be listed
    assert "RESULT 2 " in script(env, path, "1").stdout
    checkpoints = wait_until(lambda: [c for c in listed() if c["status"] == "available"
                                      and c["checkpoint_id"] not in before], timeout=120)
    deployment = checkpoints[0]["deployment_id"]
    assert deployment.startswith("fn-")
    drawn = []
    for _ in range(2):  # two restores of the one checkpoint
        stop_all(env, deployment)
        out = script(env, path, "5").stdout
        assert "RESULT 10" in out
        drawn.append(out.split("RESULT 10 ")[1].split()[0])
        notes = [c["note"] for c in json.loads(cli(env, "containers", "list", "--json").stdout)
                 if c["deployment_id"] == deployment]
        assert notes and notes[0].startswith("restored from")
    assert drawn[0] != drawn[1]  # the executor reseeded random after each restore


def stop_all(env: dict, deployment: str) -> None:
    for c in json.loads(cli(env, "containers", "list", "--json").stdout):
        if c["deployment_id"] == deployment:
            cli(env, "containers", "stop", c["container_id"])
    wait_until(lambda: not [c for c in json.loads(cli(env, "containers", "list", "--json").stdout)
                            if c["deployment_id"] == deployment], timeout=60)


def test_values_over_4_mib_go_through_s3_and_are_deleted(env):
    proc = script(env, APPS / "fn_large.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"RESULT {7 << 20} True" in proc.stdout
    keys = asyncio.run(call_blobs(env))
    assert len(keys) == 1  # the input was deleted once read; the result stays 15 min for the client


async def call_blobs(env: dict) -> list[str]:
    from levers9.runtime.config import Settings
    from levers9.runtime.storage import s3_client, workspace_bucket

    state = json.loads((Path(env["LEVERS9_HOME"]) / "state.json").read_text())
    # the profile's S3 keys: the admin's, generated for this stack
    settings = Settings.load(env={"LEVERS9_HOME": env["LEVERS9_HOME"]}).with_(s3_endpoint=state["s3_endpoint"])
    async with s3_client(settings) as client:
        listed = await client.list_objects_v2(Bucket=workspace_bucket("default"), Prefix="calls/")
    return [o["Key"] for o in listed.get("Contents", [])]
