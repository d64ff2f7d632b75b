"""Task queues and schedules end to end on real runc sandboxes: put tasks (SDK, REST, CLI) and see
their results; retries and one recorded failure; a TTL expiry; callbacks retried; the gateway and the
worker SIGKILLed while tasks run, every task still completed exactly once as recorded; a schedule
firing every minute exactly once per tick; bad input refused.

Its own stack: it SIGKILLs services, which the shared one must never see."""

from __future__ import annotations

import asyncio
import datetime as dt
import gzip
import io
import json
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from _e2e import api, bus_auth, cli, needs_runc, one_worker_stack, wait_until

pytestmark = pytest.mark.slow

APPS = Path(__file__).parent / "apps"
ENDED = ("succeeded", "failed", "expired", "cancelled")
TERMINAL = ("TaskSucceeded", "TaskFailed", "TaskExpired", "TaskCancelled")
RECOVERY_S = 300

needs_runc()


class Callbacks:
    """A loopback HTTP server that refuses each task's first callback (500) and keeps every body."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        seen: Counter[str] = Counter()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                seen[body["task_id"]] += 1
                self.send_response(500 if seen[body["task_id"]] == 1 else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/done"


@pytest.fixture(scope="module")
def callbacks():
    c = Callbacks()
    yield c
    c.server.shutdown()


@pytest.fixture(scope="module")
def env(tmp_path_factory, callbacks):
    home = tmp_path_factory.mktemp("l9tasks")
    with one_worker_stack(home, 4000, 4096) as e:
        e = {**e, "TASKS_CALLBACK": callbacks.url}
        cli(e, "deploy", str(APPS / "tasks_app.py"))
        yield e


def put(env: dict, queue: str, *args: object, **kwargs: object) -> str:
    r = api(env, "POST", f"/taskqueue/{queue}", json={"args": list(args), "kwargs": kwargs})
    assert r.status_code == 202, r.text
    return r.json()["task_id"]


def put_batch(env: dict, queue: str, items: list) -> list[str]:
    r = api(env, "POST", f"/taskqueue/{queue}/batch", json=items)
    assert r.status_code == 202 and r.json()["queue"] == queue, r.text
    return r.json()["task_ids"]


def running(env: dict, queue: str) -> set[str]:
    r = api(env, "GET", "/api/v1/tasks", params={"queue": queue, "status": "running", "limit": 1000})
    assert r.status_code == 200, r.text
    return {t["task_id"] for t in r.json()["tasks"]}


def task(env: dict, task_id: str) -> dict:
    r = api(env, "GET", f"/api/v1/tasks/{task_id}")
    assert r.status_code == 200, r.text
    return r.json()


def ended(env: dict, task_id: str, timeout: float = RECOVERY_S) -> dict:
    return wait_until(lambda: (t := task(env, task_id))["status"] in ENDED and t, timeout=timeout, every=0.5)


def task_events(env: dict) -> list[dict]:
    out = cli(env, "events", "replay", "--aggregate", "task", "--json").stdout
    return [json.loads(x) for x in out.splitlines() if x.strip()]


def outcomes_per_task(env: dict, ids: list[str]) -> Counter[str]:
    return Counter(e["data"]["task_id"] for e in task_events(env) if e["type"] in TERMINAL and e["data"]["task_id"] in ids)


def test_tasks_put_over_rest_the_sdk_and_listed_by_the_cli_complete_with_their_results(env):
    task_id = put(env, "square", 3)
    done = ended(env, task_id)
    assert done["status"] == "succeeded" and done["result"] == 9, done
    assert "squaring 3" in done["output"]  # the run's log is the task's
    code = (f"import sys; sys.path.insert(0, {str(APPS)!r}); import tasks_app\n"
            "h = tasks_app.square.put(7, delay=0.1)\n"
            "print('ID', h); print('RESULT', h.result(timeout=300))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0 and "RESULT 49" in proc.stdout, proc.stdout + proc.stderr
    listed = json.loads(cli(env, "tasks", "list", "--queue", "square", "--json").stdout)
    assert task_id in {t["task_id"] for t in listed}
    shown = json.loads(cli(env, "tasks", "show", task_id, "--json").stdout)
    assert shown["result"] == 9
    assert task_id in cli(env, "tasks", "list").stdout  # the table
    text = cli(env, "tasks", "show", task_id).stdout
    assert "status: succeeded" in text and "result: 9" in text and "squaring 3" in text


def test_a_batch_is_enqueued_and_every_task_succeeds_once(env):
    """`POST /taskqueue/NAME/batch` and the SDK's put_many (map-like, sent in chunks): every task runs
    with its own arguments and has one outcome."""
    ids = put_batch(env, "square", [{"args": [n]} for n in range(30)] + [{"x": 30}])
    assert len(set(ids)) == 31
    code = (f"import sys; sys.path.insert(0, {str(APPS)!r}); import tasks_app\n"
            "from levers9 import task_queues; task_queues.BATCH = 4\n"  # 10 tasks: three requests
            "hs = tasks_app.square.put_many(range(100, 110), delay=0.0)\n"
            "print('IDS', ' '.join(hs)); print('RESULTS', [h.result(timeout=300) for h in hs])\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"RESULTS {[n * n for n in range(100, 110)]}" in proc.stdout, proc.stdout
    sdk_ids = next(line for line in proc.stdout.splitlines() if line.startswith("IDS ")).split()[1:]
    done = {i: ended(env, i) for i in ids}
    assert [done[i]["result"] for i in ids] == [n * n for n in range(31)]
    assert outcomes_per_task(env, ids + sdk_ids) == Counter({i: 1 for i in ids + sdk_ids})


def test_a_failing_task_is_retried_then_its_one_failure_is_recorded(env):
    task_id = put(env, "flaky", 5)
    done = ended(env, task_id)
    assert done["status"] == "failed" and done["attempt"] == 2, json.dumps(done)
    assert "always fails 5" in done["error"]["reason"] + done["error"]["traceback"]
    mine = [e["type"] for e in task_events(env) if e["data"]["task_id"] == task_id]
    assert mine.count("TaskRetried") == 1 and mine.count("TaskFailed") == 1 and mine.count("TaskStarted") == 2, mine


def test_a_task_past_its_ttl_expires_with_that_reason(env):
    """A task that waited past its TTL (published by another system, enqueued two minutes ago with a
    one-second TTL) is expired by the runner that finds it, never run."""
    from levers9.contracts import envelope
    from levers9.contracts import events as E
    from levers9.runtime.bus import Bus

    dep = next(d for d in api(env, "GET", "/api/v1/deployments").json() if d["name"] == "square")
    task_id = str(uuid.uuid4())
    event = E.TaskEnqueued(task_id=task_id, deployment_id=dep["deployment_id"], queue="square",
                           payload='{"args": [2], "kwargs": {}}', enqueued_at=time.time() - 120, ttl_seconds=1)
    nats = next(c["url"] for c in json.loads(cli(env, "status", "--json").stdout)["components"] if c["name"] == "nats")

    async def publish() -> None:
        bus = await Bus.connect(nats, auth=bus_auth(env))
        await bus.publish(envelope(event, workspace="default"))
        await bus.close()

    asyncio.run(publish())
    done = ended(env, task_id)
    assert done["status"] == "expired" and "ttl" in done["error"]["reason"], done
    assert "TaskStarted" not in [e["type"] for e in task_events(env) if e["data"]["task_id"] == task_id]


def test_a_task_that_waits_for_a_sandbox_past_its_ttl_expires_and_never_runs(env):
    """`single` has one sandbox serving one task at a time and a 5 s TTL: a task put while another
    runs there waits for the slot, and expires once its TTL passes."""
    # warm its sandbox first: a cold start may itself outlast the TTL (then that task expires: try again)
    wait_until(lambda: ended(env, put(env, "single", 0))["status"] == "succeeded", timeout=RECOVERY_S)
    first = put(env, "single", 20)
    wait_until(lambda: task(env, first)["status"] == "running", timeout=RECOVERY_S, every=0.5)
    second = put(env, "single", 1)
    done = ended(env, second, timeout=60)
    assert done["status"] == "expired" and "no sandbox was free" in done["error"]["reason"], done
    assert "TaskStarted" not in [e["type"] for e in task_events(env) if e["data"]["task_id"] == second]
    assert ended(env, first)["status"] == "succeeded"


def test_a_refused_callback_is_posted_again_with_the_result(env, callbacks):
    task_id = put(env, "square", 4)
    assert ended(env, task_id)["result"] == 16
    posts = wait_until(lambda: (p := [b for b in callbacks.bodies if b["task_id"] == task_id]) and len(p) >= 2 and p,
                       timeout=120)
    assert all(p["status"] == "succeeded" and p["result"] == 16 for p in posts)


def test_a_running_task_cancelled_ends_cancelled_once_and_an_ended_one_cannot_be(env):
    task_id = put(env, "square", 6, delay=60)
    wait_until(lambda: task(env, task_id)["status"] == "running", timeout=RECOVERY_S, every=0.5)
    cli(env, "tasks", "cancel", task_id)
    done = ended(env, task_id, timeout=30)
    assert done["status"] == "cancelled" and "cancelled by token" in done["error"]["reason"], done
    again = api(env, "POST", f"/api/v1/tasks/{task_id}/cancel")
    assert again.status_code == 409 and "already ended" in again.json()["detail"]
    # the stopped attempt has ended (its call is no longer running): its own outcome was dropped
    wait_until(lambda: not api(env, "GET", "/api/v1/calls", params={"status": "running"}).json(), timeout=60)
    assert outcomes_per_task(env, [task_id]) == Counter({task_id: 1})


@pytest.mark.parametrize("victim", ["gateway", "worker", "scheduler"])
def test_tasks_survive_a_sigkill_and_each_is_recorded_once(env, victim):
    from levers9.runtime.config import Settings
    from levers9.stack import Stack

    # one batch, and one listing per look: twelve puts and twelve reads in turn, at ~0.35 s each on a
    # loaded machine, took longer than the tasks run (3 s), so "two running at once" was never seen
    ids = put_batch(env, "square", [{"args": [n], "kwargs": {"delay": 3}} for n in range(12)])
    wait_until(lambda: len(running(env, "square") & set(ids)) >= 2, timeout=RECOVERY_S, every=0.2)
    Stack(Path(env["LEVERS9_HOME"]), Settings.load(env)).kill_service(victim)
    cli(env, "up")  # restarts what is not running
    done = {i: ended(env, i) for i in ids}
    assert {i: d["status"] for i, d in done.items()} == {i: "succeeded" for i in ids}
    assert {d["result"] for d in done.values()} == {n * n for n in range(12)}
    assert outcomes_per_task(env, ids) == Counter({i: 1 for i in ids})  # exactly once as recorded
    started = Counter(e["data"]["task_id"] for e in task_events(env) if e["type"] == "TaskStarted" and e["data"]["task_id"] in ids)
    print(f"\nTASKS sigkill {victim}: {sum(n > 1 for n in started.values())} of {len(ids)} tasks ran again", flush=True)


def test_a_schedule_fires_each_minute_exactly_once(env):
    rows = json.loads(cli(env, "schedules", "list", "--json").stdout)
    [minutely] = [s for s in rows if s["name"] == "minutely"]
    assert minutely["cron"] == "* * * * *" and len(minutely["next_runs"]) == 3
    assert minutely["next_runs"][0] > dt.datetime.now(dt.timezone.utc).isoformat()
    assert "minutely" in cli(env, "schedules", "list").stdout

    def fired() -> list[dict]:
        out = cli(env, "events", "replay", "--aggregate", "schedule", "--json").stdout
        return [json.loads(x)["data"] for x in out.splitlines() if x.strip()]

    ticks = wait_until(lambda: len(f := fired()) >= 2 and f, timeout=200, every=2)
    assert len({t["tick"] for t in ticks}) == len(ticks)  # never one tick twice
    for t in ticks:
        done = ended(env, t["task_id"])
        assert done["status"] == "succeeded" and done["tick"] == t["tick"] and "tick ran at" in done["output"], done
    enqueued = [e for e in task_events(env) if e["type"] == "TaskEnqueued" and e["data"]["schedule_id"] == "minutely"]
    per_tick = Counter(e["data"]["tick"] for e in enqueued)
    assert set(per_tick.values()) == {1}, per_tick  # each tick's task enqueued once
    # the schedule kept firing meanwhile (CI: a tick between the two reads): each tick read first was
    # enqueued, and each tick enqueued is one the schedule fired, read after
    assert {t["tick"] for t in ticks if t["task_id"]} <= set(per_tick)
    assert set(per_tick) <= {t["tick"] for t in fired() if t["task_id"]}, per_tick


def _archive() -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        data = b"def f():\n    return 1\n"
        info = tarfile.TarInfo("bad.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize(("schedule", "field"), [({"cron": "61 * * * *"}, "cron"),
                                                 ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone")])
def test_a_bad_cron_or_time_zone_is_refused_at_deploy_naming_the_field(env, schedule, field):
    spec = {"name": "bad", "app_name": "bad", "code": {"kind": "function", "module": "bad", "handler": "f"},
            "schedule": schedule}
    r = api(env, "POST", "/api/v1/deployments", data={"spec": json.dumps(spec)},
            files={"code": ("code.tar.gz", _archive(), "application/gzip")})
    assert r.status_code in (400, 422) and field in r.text and "schedule" in r.text, r.text


def test_bad_task_input_is_refused(env):
    big = api(env, "POST", "/taskqueue/square", json={"args": ["x" * (300 << 10)]})
    assert big.status_code == 413, big.text
    assert api(env, "POST", "/taskqueue/no-such-queue", json={}).status_code == 404
    assert api(env, "POST", "/taskqueue/minutely-nope", json={}).status_code == 404
    assert api(env, "GET", f"/api/v1/tasks/{uuid.uuid4()}").status_code == 404
    def square_enqueued() -> int:
        return sum(e["type"] == "TaskEnqueued" and e["data"]["queue"] == "square" for e in task_events(env))

    before = square_enqueued()
    big = api(env, "POST", "/taskqueue/square/batch", json=[{"args": [1]}, {"args": ["x" * (300 << 10)]}])
    assert big.status_code == 413 and "task 1 of the batch" in big.json()["detail"], big.text
    for body, says in (([], "empty"), ({"args": [1]}, "JSON array"), ([{}] * 1001, "at most 1000"),
                       ([{}, {"args": "no"}], "task 1 of the batch")):
        r = api(env, "POST", "/taskqueue/square/batch", json=body)
        assert r.status_code == 422 and says in r.json()["detail"], r.text
    assert api(env, "POST", "/taskqueue/no-such-queue/batch", json=[{}]).status_code == 404
    assert square_enqueued() == before  # a refused batch enqueues none of its tasks


def test_another_workspace_s_task_is_not_found(env):
    from levers9.cli import publish_token

    task_id = put(env, "square", 2)
    nats = next(c["url"] for c in json.loads(cli(env, "status", "--json").stdout)["components"] if c["name"] == "nats")
    token = "l9_" + uuid.uuid4().hex
    asyncio.run(publish_token(nats, token, "tasks-other", workspace="other", auth=bus_auth(env)))
    url = tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())["gateway_url"]
    headers = {"Authorization": f"Bearer {token}"}
    wait_until(lambda: httpx.get(f"{url}/api/v1/whoami", headers=headers, timeout=10).status_code == 200, timeout=60)
    assert httpx.get(f"{url}/api/v1/tasks/{task_id}", headers=headers, timeout=30).status_code == 404
    assert httpx.post(f"{url}/api/v1/tasks/{task_id}/cancel", headers=headers, timeout=30).status_code == 404
    assert httpx.post(f"{url}/taskqueue/square", headers=headers, json={}, timeout=30).status_code == 404
    assert httpx.post(f"{url}/taskqueue/square/batch", headers=headers, json=[{}], timeout=30).status_code == 404
