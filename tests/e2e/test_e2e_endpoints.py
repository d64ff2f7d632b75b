"""Endpoints end to end on real runc containers: deploy with the CLI, call through the gateway,
scale to zero, bad input, a worker SIGKILLed with a call pending, two schedulers at once.

One stack for the module, started by the real CLI (`levers9 up`) in a temporary LEVERS9_HOME, with
a pools file that lets the pool controller start a second local worker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import tomllib
import uuid
from pathlib import Path

import httpx
import psutil
import pytest
from _e2e import bus_auth, cli, wait_until

from levers9.contracts import envelope
from levers9.contracts import events as E
from levers9.runtime.bus import Bus
from levers9.stack import free_port

pytestmark = pytest.mark.slow

APPS = Path(__file__).parent / "apps"
ROOT = Path(__file__).resolve().parents[2]

if os.geteuid() != 0 or not any(Path(p, "runc").exists() for p in os.environ.get("PATH", "").split(":")):
    pytest.skip("runc containers need root and runc (scripts/setup.sh installs runc)", allow_module_level=True)




@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("l9endpoints")
    pools = home / "pools.toml"
    pools.write_text('[pools.default]\nbackend = "local"\nmin_warm = 1\nmax_workers = 2\nidle_timeout_s = 600\n'
                     'worker_cpu_millicores = 2000\nworker_memory_mib = 2048\n')
    e = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    e.update(LEVERS9_HOME=str(home), LEVERS9_POOLS_FILE=str(pools), LEVERS9_WORKER_CPU_MILLICORES="2000",
             LEVERS9_WORKER_MEMORY_MIB="2048")
    try:
        cli(e, "up")
        wait_until(lambda: any(w["status"] == "ready" and "runc" in w["features"]
                               for w in api(e, "GET", "/api/v1/workers").json()), timeout=600)
        yield e
    finally:
        cli(e, "down", check=False)


def profile(env: dict) -> dict:
    return tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())


def api(env: dict, method: str, path: str, token: str | None = None, **kw) -> httpx.Response:
    p = profile(env)
    headers = {"Authorization": f"Bearer {token or p['token']}", **kw.pop("headers", {})}
    return httpx.request(method, p["gateway_url"] + path, headers=headers, timeout=kw.pop("timeout", 120), **kw)




@pytest.fixture(scope="module")
def deployed(env):
    out = cli(env, "deploy", str(APPS / "probe.py"))
    assert "probe" in out.stdout + out.stderr
    return True


def containers(env, all_=False) -> list[dict]:
    r = api(env, "GET", "/api/v1/containers", params={"all": "true" if all_ else "false"})
    assert r.status_code == 200, r.text
    return r.json()


def test_hello_example_deploys_and_answers(env):
    cli(env, "deploy", str(ROOT / "examples" / "hello.py"))
    r = api(env, "POST", "/endpoint/hello", json={"name": "levers9"})
    assert r.status_code == 200, r.text
    assert "levers9" in json.dumps(r.json())


def test_a_call_runs_in_a_runc_container_with_its_on_start_value(env, deployed):
    r = api(env, "POST", "/endpoint/probe", json={"echo": "hi"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["echo"] == "hi"
    assert body["pid"] < 10, "the runner should be (nearly) pid 1 of its own pid namespace"
    assert body["app_files"] == ["probe.py"] or "probe.py" in body["app_files"]
    assert body["on_start"]["loaded_at"] > 0
    listed = [c for c in json.loads(cli(env, "containers", "list", "--json").stdout)
              if c["container_id"] == body["container_id"]]
    assert listed and listed[0]["status"] == "ready"
    # the same container answers the next call (warm), with a sub-path and a query
    again = api(env, "GET", "/endpoint/probe/latest/anything", params={"echo": "q"})
    assert again.status_code == 200 and again.json()["container_id"] == body["container_id"]
    assert again.json()["echo"] == "q"
    versioned = api(env, "GET", "/endpoint/probe/v1")
    assert versioned.status_code == 200


def test_idle_container_scales_to_zero_and_the_next_call_starts_a_new_one(env, deployed):
    first = api(env, "POST", "/endpoint/probe", json={}).json()["container_id"]
    # idle past its keep_warm_seconds (20: long enough for the test above to list it and call it
    # again on a loaded machine), then stopped
    wait_until(lambda: all(c["container_id"] != first for c in containers(env)), timeout=120)
    stopped = [c for c in containers(env, all_=True) if c["container_id"] == first][0]
    assert stopped["status"] == "stopped" and "idle" in stopped["reason"]
    second = api(env, "POST", "/endpoint/probe", json={}).json()["container_id"]
    assert second != first


def test_bad_input_gets_clear_errors(env, deployed):
    assert api(env, "POST", "/endpoint/probe", token="l9_nope").status_code == 401
    missing = api(env, "POST", "/endpoint/does-not-exist")
    assert missing.status_code == 404 and "levers9 deploy" in missing.json()["detail"]
    big = api(env, "POST", "/endpoint/probe", content=b"x" * (17 * 1024 * 1024),
              headers={"Content-Type": "application/json"})
    assert big.status_code == 413
    not_json = api(env, "POST", "/endpoint/probe", content=b"[1, 2]", headers={"Content-Type": "application/json"})
    assert not_json.status_code == 400
    wrong_kwargs = api(env, "POST", "/endpoint/probe", json={"nope": 1})
    assert wrong_kwargs.status_code == 422
    boom = api(env, "POST", "/endpoint/boom", json={"x": 7})
    assert boom.status_code == 500 and "boom 7" in boom.json()["error"]


def test_an_app_that_fails_to_import_in_its_container_fails_the_call_with_the_reason(env):
    cli(env, "deploy", str(APPS / "needs_yaml.py"))
    r = api(env, "POST", "/endpoint/needs-yaml", json={})
    assert r.status_code == 502, r.text
    assert "yaml" in r.json()["detail"]
    corr = r.json()["correlation_id"]
    types = [json.loads(x)["type"] for x in cli(env, "events", "replay", "--json", "--correlation-id", corr)
             .stdout.splitlines()]
    assert "ContainerRequested" in types and "ContainerFailed" in types
    assert not [c for c in containers(env) if c.get("deployment_name") == "needs-yaml"]  # nothing half-running


def test_a_broken_app_file_is_refused_by_deploy_with_a_sentence(env, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import this_module_does_not_exist\n")
    out = cli(env, "deploy", str(bad), check=False)
    assert out.returncode != 0 and "this_module_does_not_exist" in out.stderr + out.stdout


def test_a_container_out_of_memory_fails_cleanly(env, deployed):
    r = api(env, "POST", "/endpoint/hog", json={})
    assert r.status_code in (502, 503), r.text
    failed = wait_until(lambda: [c for c in containers(env, all_=True)
                                 if c.get("deployment_name") == "hog" and c["status"] == "failed"], timeout=30)
    assert "memory" in failed[0]["reason"].lower()


def test_sigkill_of_the_worker_holding_a_pending_call_gets_it_served_elsewhere(env):
    cli(env, "deploy", str(APPS / "probe.py"))
    home = Path(env["LEVERS9_HOME"])
    result: dict = {}

    def call():
        result["response"] = api(env, "POST", "/endpoint/slow", json={}, timeout=120)

    caller = threading.Thread(target=call)
    caller.start()
    try:
        placed = wait_until(lambda: [c for c in containers(env) if c.get("deployment_name") == "slow"
                                     and c["status"] in ("scheduled", "starting") and c["worker_id"]], timeout=60)
    except AssertionError:
        caller.join(timeout=1)
        raise AssertionError(f"the slow call's container was never placed: call={result.get('response')!r} "
                             f"{getattr(result.get('response'), 'text', '')[:500]} containers="
                             f"{[c for c in containers(env, all_=True) if c.get('deployment_name') == 'slow']} "
                             f"workers={api(env, 'GET', '/api/v1/workers').json()}") from None
    victim = placed[0]["worker_id"]
    pid = worker_pid(home, victim)
    os.kill(pid, signal.SIGKILL)
    caller.join(timeout=150)
    r = result["response"]
    assert r.status_code == 200, r.text
    row = [c for c in containers(env, all_=True) if c["container_id"] == placed[0]["container_id"]][0]
    assert row["worker_id"] != victim and row["attempt"] >= 2
    cli(env, "up")  # restarts local-1 if it was the victim


def worker_pid(home: Path, worker_id: str) -> int:
    for p in psutil.process_iter(["environ", "cmdline"]):
        try:
            e = p.info["environ"] or {}
        except psutil.Error:
            continue
        if e.get("LEVERS9_HOME") == str(home) and e.get("LEVERS9_SERVICE") == "worker" and \
                e.get("LEVERS9_WORKER_ID", "local-1") == worker_id and "service" in (p.info["cmdline"] or []):
            return p.pid
    raise AssertionError(f"no process for worker {worker_id}")


def test_two_schedulers_never_overbook_a_worker(env):
    """Two scheduler processes race for 4 fake workers of 1000m each in their own pool; the log must
    never show more than 2 slots of 500m on any of them at a time."""
    home = Path(env["LEVERS9_HOME"])
    state = json.loads((home / "state.json").read_text())
    sched_pid = json.loads((home / "state.json").read_text())["components"]["scheduler"]["pid"]
    second_env = {**psutil.Process(sched_pid).environ(), "LEVERS9_HTTP_PORT": str(free_port())}
    second = subprocess.Popen([sys.executable, "-m", "levers9", "service", "scheduler"], env=second_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pool = f"ob{uuid.uuid4().hex[:6]}"
    fakes = [f"{pool}-w{i}" for i in range(4)]
    stop = threading.Event()

    async def setup_and_beat():
        bus = await Bus.connect(state["nats_url"], auth=bus_auth(env))
        for w in fakes:
            await bus.publish(envelope(E.WorkerRegistered(worker_id=w, pool=pool, cpu_millicores=1000,
                                                          memory_mib=1024, features=["runc"]), workspace="_sys"))
            await bus.publish(envelope(E.WorkerReady(worker_id=w), workspace="_sys"))
        kv = await bus.heartbeats()
        while not stop.is_set():
            for w in fakes:
                await kv.put(w, b"{}")
            await asyncio.sleep(1)
        await bus.close()

    beater = threading.Thread(target=lambda: asyncio.run(setup_and_beat()))
    beater.start()
    try:
        wait_until(lambda: {w["worker_id"] for w in api(env, "GET", "/api/v1/workers").json()
                            if w["status"] == "ready"} >= set(fakes), timeout=30)
        requested = []
        with httpx.Client() as client:
            p = profile(env)
            for _ in range(20):
                r = client.post(p["gateway_url"] + "/api/v1/containers",
                                json={"cpu_millicores": 500, "memory_mib": 128, "pool": pool},
                                headers={"Authorization": f"Bearer {p['token']}"})
                assert r.status_code == 202
                requested.append(r.json()["container_id"])

        def worker_events():
            async def read_all():
                from levers9.runtime.reader import read
                bus = await Bus.connect(state["nats_url"], auth=bus_auth(env))
                out = []
                async for msgs in read(bus, [f"levers9._sys.worker.{w}.*" for w in fakes]):
                    out += [(m.metadata.sequence.stream, json.loads(m.data)) for m in msgs]
                await bus.close()
                return out
            return [(d["type"], {**d["data"], "seq": seq}) for seq, d in asyncio.run(read_all())
                    if d["type"] in ("WorkerSlotReserved", "WorkerSlotReleased", "WorkerLost")]

        def placed():
            return sum(1 for t, _ in worker_events() if t == "WorkerSlotReserved") >= 8

        wait_until(placed, timeout=60)

        def decided():  # every request has a decision: 8 placed, the rest deferred (the pool is full)
            rows = {c["container_id"]: c["status"] for c in containers(env, all_=True)}
            return all(rows.get(cid) in ("scheduled", "pending") for cid in requested)

        wait_until(decided, timeout=60)
        events = worker_events()
        used: dict[str, int] = {}
        slots: dict[tuple[str, str], tuple[int, int]] = {}  # -> (reservation seq, cpu)
        for kind, data in events:  # capacity in log order, as the projections count it: never over 1000m
            key = (data["worker_id"], data["container_id"])
            if kind == "WorkerSlotReserved" and key not in slots:
                slots[key] = (data["seq"], data["cpu_millicores"])
                used[data["worker_id"]] = used.get(data["worker_id"], 0) + data["cpu_millicores"]
                assert used[data["worker_id"]] <= 1000, events
            elif kind == "WorkerSlotReleased" and key in slots and data["reserved_seq"] in (0, slots[key][0]):
                used[data["worker_id"]] -= slots.pop(key)[1]
        assert not any(t == "WorkerLost" for t, _ in events), events
        assert len(slots) == 8 and all(v == 1000 for v in used.values()), used
        assert second.poll() is None
    finally:
        stop.set()
        beater.join()
        second.send_signal(signal.SIGTERM)
        second.wait(20)
