"""The autoscaler end to end on the lane's shared stack (`shared_env`, tests/e2e/conftest.py):
min_containers=1 keeps one container ready with no call ever made, a killed one is replaced, the
reason of each start and stop is in the log, `deployments scale --buffer 1` adds an idle one and
`--min 0 --buffer 0` lets them go, a bad combination is refused with the field named, two
scheduler replicas start the minimum once, and a deployed function is kept warm, called on its warm
sandbox and let go the same way, while a session's sandbox of it is neither counted nor stopped. Conditions are waited on with generous ceilings."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import httpx
import psutil
import pytest
from _e2e import api, bus_auth, cli, needs_runc, wait_until

needs_runc()
pytestmark = pytest.mark.slow

APPS = Path(__file__).parent / "apps"
CEILING = 180.0  # a cold start on a loaded machine; the policy itself acts within a second


@pytest.fixture(scope="module")
def env(shared_env):
    cli(shared_env, "deploy", str(APPS / "warm.py"))
    return shared_env


def live(env: dict) -> list[dict]:
    return [c for c in api(env, "GET", "/api/v1/containers").json()
            if c.get("deployment_id", "").startswith("warm-") and c["status"] not in ("stopped", "failed")]


def ready_one(env: dict, other_than: str = "") -> str:
    got = wait_until(lambda: [c["container_id"] for c in live(env)
                              if c["status"] == "ready" and c["container_id"] != other_than], timeout=CEILING)
    return got[0]


def replayed(env: dict, event_type: str) -> list[dict]:
    out = cli(env, "events", "replay", "--type", event_type, "--json").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]


def test_min_containers_keeps_one_warm_with_no_call_and_replaces_it(env):
    first = ready_one(env)  # no call was ever made
    [row] = [d for d in json.loads(cli(env, "deployments", "list", "--json").stdout) if d["name"] == "warm"]
    assert row["desired"] == 1 and row["containers"] >= 1, row
    reasons = [e["data"]["reason"] for e in replayed(env, "ContainerRequested")
               if e["data"]["container_id"] == first]
    assert reasons and reasons[0].startswith("autoscaler: min_containers=1"), reasons
    r = api(env, "POST", f"/api/v1/containers/{first}/stop")  # killed from outside the policy
    assert r.status_code in (200, 202), r.text
    second = ready_one(env, other_than=first)
    assert second != first
    wait_until(lambda: len(live(env)) == 1, timeout=CEILING)  # one, not two: the minimum is one


def test_scale_at_run_time_buffer_then_zero_and_bad_combinations_name_the_field(env):
    ready_one(env)
    bad = api(env, "POST", "/api/v1/deployments/warm/scale", json={"min": 3})
    assert bad.status_code == 422 and "min_containers" in bad.text, bad.text
    assert api(env, "POST", "/api/v1/deployments/nope/scale", json={"min": 0}).status_code == 404
    assert as_other_workspace(env, "POST", "/api/v1/deployments/warm/scale", json={"min": 0}).status_code == 404
    refused = cli(env, "deployments", "scale", "warm", "--target-concurrency", "5", check=False)
    assert refused.returncode != 0 and "target_concurrency" in refused.stdout + refused.stderr
    cli(env, "deployments", "scale", "warm", "--buffer", "1")  # one idle beside the minimum
    wait_until(lambda: len([c for c in live(env) if c["status"] == "ready"]) == 2, timeout=CEILING)
    cli(env, "deployments", "scale", "warm", "--min", "0", "--buffer", "0")
    wait_until(lambda: not live(env), timeout=CEILING)  # idle past its 2 s window, no minimum: stopped
    stops = [e["data"]["reason"] for e in replayed(env, "ContainerStopRequested")
             if e["data"]["reason"].startswith("autoscaler: ")]
    assert any("scaledown_window=2" in s for s in stops), stops
    [row] = [d for d in json.loads(cli(env, "deployments", "list", "--json").stdout) if d["name"] == "warm"]
    assert row["desired"] == 0 and row["spec"]["scaling"]["min_containers"] == 0, row


def test_a_deployed_function_is_kept_warm_with_no_call_served_there_and_let_go(env):
    cli(env, "deploy", str(APPS / "warm_fn.py"))
    [row] = [d for d in json.loads(cli(env, "deployments", "list", "--json").stdout)
             if d["name"] == "warmfn" and d["status"] == "active"]
    dep = row["deployment_id"]
    mine = lambda: [c for c in api(env, "GET", "/api/v1/containers").json()  # noqa: E731
                    if c.get("deployment_id") == dep and c["status"] not in ("stopped", "failed")]
    [first] = wait_until(lambda: [c["container_id"] for c in mine() if c["status"] == "ready"], timeout=CEILING)
    reasons = [e["data"]["reason"] for e in replayed(env, "ContainerRequested") if e["data"]["container_id"] == first]
    assert reasons and reasons[0].startswith("autoscaler: min_containers=1"), reasons  # no call was made
    r = api(env, "POST", "/function/warm-fn/warmfn", json={"args": [21]})
    assert r.status_code == 200 and r.json()["result"] == 42, r.text
    calls = cli(env, "events", "replay", "--aggregate", "call", "--type", "FunctionCallStarted", "--json").stdout
    ran_on = [json.loads(ln)["data"]["container_id"] for ln in calls.splitlines()
              if ln.strip().startswith("{") and json.loads(ln)["data"]["deployment_id"] == dep
              and not json.loads(ln)["data"].get("session_id")]
    assert ran_on == [first], ran_on  # the warm sandbox served it: no cold start
    [row] = [d for d in json.loads(cli(env, "deployments", "list", "--json").stdout) if d["deployment_id"] == dep]
    assert row["desired"] == 1 and row["containers"] == 1, row
    session_sandbox_is_neither_counted_nor_stopped(env, dep, first, mine)
    cli(env, "deployments", "scale", "warmfn", "--min", "0")
    wait_until(lambda: not mine(), timeout=CEILING)  # idle past its 2 s window, no minimum: stopped
    stops = [e["data"]["reason"] for e in replayed(env, "ContainerStopRequested")
             if e["data"]["container_id"] == first]
    assert stops and stops[0].startswith("autoscaler: ") and "scaledown_window=2" in stops[0], stops


SESSION = """
import sys
from levers9 import Function, Session
f = Function.lookup("warm-fn", "warmfn")
with Session("warm-fn"):
    print("R1", f.remote(1), flush=True)
    sys.stdin.readline()
    print("R2", f.remote(2), flush=True)
"""


def session_sandbox_is_neither_counted_nor_stopped(env: dict, dep: str, warm: str, mine) -> None:
    """A session's sandbox carries the function's deployment: the autoscaler must not count it (the
    minimum's container stays, none is added for it) nor stop it when it is idle past the window
    (shown by a buffer container that is stopped as idle meanwhile); its next call lands there."""
    proc = subprocess.Popen([sys.executable, "-c", SESSION], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line.strip() == "R1 2", line + (proc.stderr.read() if proc.poll() is not None else "")
        [sandbox] = session_calls(env, dep)
        assert sandbox != warm and sandbox in [c["container_id"] for c in mine()]
        [row] = [d for d in json.loads(cli(env, "deployments", "list", "--json").stdout) if d["deployment_id"] == dep]
        assert row["desired"] == 1 and row["containers"] == 1, row  # the session's sandbox is its caller's
        cli(env, "deployments", "scale", "warmfn", "--buffer", "1")
        ready = lambda: [c["container_id"] for c in mine() if c["status"] == "ready"]  # noqa: E731
        [extra] = wait_until(lambda: [c for c in ready() if c not in (warm, sandbox)], timeout=CEILING)
        cli(env, "deployments", "scale", "warmfn", "--buffer", "0")
        # one of the two idle past 2 s is stopped (the longest idle first), down to the minimum; the
        # session's sandbox, idle longer than either, is not the autoscaler's
        wait_until(lambda: len([c for c in ready() if c in (warm, extra)]) == 1, timeout=CEILING)
        assert sandbox in ready()
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=CEILING)
        assert proc.returncode == 0 and "R2 4" in out, out + err
        assert session_calls(env, dep) == [sandbox, sandbox]  # the same sandbox served the session's calls
        wait_until(lambda: sandbox not in [c["container_id"] for c in mine()], timeout=CEILING)  # session ended
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def session_calls(env: dict, dep: str) -> list[str]:
    """The sandboxes the deployment's session calls ran on, in order."""
    out = cli(env, "events", "replay", "--aggregate", "call", "--type", "FunctionCallStarted", "--json").stdout
    data = [json.loads(ln)["data"] for ln in out.splitlines() if ln.strip().startswith("{")]
    return [d["container_id"] for d in data if d["deployment_id"] == dep and d.get("session_id")]


def test_two_scheduler_replicas_keep_exactly_the_minimum(env):
    """A second scheduler process beside the stack's: both apply the policy to the same log; the
    starts they both decide collide on the same container id, so two are started, not four."""
    home = Path(env["LEVERS9_HOME"])
    pid = json.loads((home / "state.json").read_text())["components"]["scheduler"]["pid"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    second = subprocess.Popen([sys.executable, "-m", "levers9", "service", "scheduler"],
                              env={**psutil.Process(pid).environ(), "LEVERS9_HTTP_PORT": str(port)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _healthy(port), timeout=CEILING)
        cli(env, "deploy", str(APPS / "warm_pair.py"))
        pair = lambda: [c for c in api(env, "GET", "/api/v1/containers").json()  # noqa: E731
                        if c.get("deployment_id", "").startswith("warm-pair-") and c["status"] == "ready"]
        # a duplicate start would come from the same pass as the first ones (both replicas saw the
        # deployment at once), seconds before two containers are ready: by then it is in the log
        wait_until(lambda: len(pair()) >= 2, timeout=CEILING)
        starts = [e for e in replayed(env, "ContainerRequested")
                  if e["data"].get("deployment_id", "").startswith("warm-pair-")
                  and e["data"]["reason"].startswith("autoscaler: ")]
        assert len(starts) == 2 and len(pair()) == 2, [e["data"]["container_id"] for e in starts]
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(second.pid, signal.SIGKILL)


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def as_other_workspace(env: dict, method: str, path: str, **kw) -> httpx.Response:
    """A call with a token of workspace `other` (published on the bus as `levers9 up` does)."""
    from levers9.cli import publish_token

    nats = next(c["url"] for c in json.loads(cli(env, "status", "--json").stdout)["components"] if c["name"] == "nats")
    token = "l9_" + uuid.uuid4().hex
    asyncio.run(publish_token(nats, token, "autoscaling", workspace="other", auth=bus_auth(env)))
    url = tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())["gateway_url"]
    headers = {"Authorization": f"Bearer {token}"}
    wait_until(lambda: httpx.get(url + "/api/v1/whoami", headers=headers, timeout=10).status_code == 200, timeout=60)
    return httpx.request(method, url + path, headers=headers, timeout=60, **kw)
