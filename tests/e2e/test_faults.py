"""Faults survived, on one stack (`levers9 up`, one local runc worker, examples/hello.py deployed):

- each of the six services SIGKILLed in turn while calls flow, then restarted by `levers9 up`:
  calls are served again, no event is in the log twice, no container attempt placed twice, every
  service's projections equal a rebuild from the log, and the node holds no container, veth,
  namespace or mount that no live container owns;
- NATS restarted (same port): every service reconnects by itself, a new container is requested,
  placed and started through the log;
- Postgres restarted (same port): every service reports healthy again and calls are served;
- S3 down for 30 s: a warm container keeps answering, a deploy fails at once with a 503 that names
  the object store, a checkpoint dumped before the outage is uploaded once S3 is back (never failed),
  and deploys work again without restarting anything;
- the worker SIGKILLed and started again: its containers are removed and reported failed at its
  start, and calls get new ones at once;
- `levers9 down` leaves no runc container, veth, namespace or mount of the stack.

Recovery bounds are generous (a 2-core CI machine); they fail only when something never recovers."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from _e2e import api, cli, needs_runc, wait_until
from _faults import Flow, Node, server_down, stack_of, state_of

from levers9.runtime.config import SERVICES

pytestmark = pytest.mark.slow
needs_runc()

ROOT = Path(__file__).resolve().parents[2]
RECOVERY_S = 120  # generous: a restart on a busy 2-core machine takes seconds, never minutes


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("l9faults")
    # only `levers9 up`'s own worker, local-1 (the pool controller starts none): every container runs
    # there, so killing it kills the worker that holds them, and `levers9 up` is its next start
    pools = home / "pools.toml"
    pools.write_text('[pools.default]\nbackend = "local"\nmin_warm = 0\nmax_workers = 0\n')
    e = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    e.update(LEVERS9_HOME=str(home), LEVERS9_POOLS_FILE=str(pools), LEVERS9_WORKER_CPU_MILLICORES="2000",
             LEVERS9_WORKER_MEMORY_MIB="2048")
    try:
        cli(e, "up")
        wait_until(lambda: any(w["status"] == "ready" and "runc" in w["features"]
                               for w in api(e, "GET", "/api/v1/workers").json()), timeout=600)
        cli(e, "deploy", str(ROOT / "examples" / "hello.py"))
        assert api(e, "POST", "/endpoint/hello", json={"name": "x"}).status_code == 200
        yield e
    finally:
        cli(e, "down", check=False)


def healthy(env: dict) -> bool:
    doc = json.loads(cli(env, "status", "--json", check=False).stdout or "{}")
    return bool(doc) and all(c["healthy"] for c in doc["components"])


def live_containers(env: dict) -> list[dict]:
    return api(env, "GET", "/api/v1/containers").json()


def events(env: dict) -> list[dict]:
    return [json.loads(x) for x in cli(env, "events", "replay", "--json").stdout.splitlines()]


def report(name: str, **figures: object) -> None:
    """Figures for RELIABILITY.md, in the test's output (`pytest -s` shows them)."""
    print(f"\nFAULT {name}: " + ", ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


def handled(env: dict, cid: str) -> bool:
    """A bare container request (no deployment) went the whole way through the log: the gateway
    published it, the scheduler placed it, the worker took it and refused it ("nothing to run"),
    and the gateway projected that."""
    row = api(env, "GET", f"/api/v1/containers/{cid}").json()
    return row.get("status") == "failed" and bool(row.get("worker_id")) and "nothing to run" in row.get("reason", "")


def settled_node_matches_containers(env: dict) -> None:
    """Every runc container on the node belongs to a live container, one each, and each has one
    veth and one namespace: nothing duplicated, nothing leaked."""
    home = Path(env["LEVERS9_HOME"])

    def consistent() -> Node | None:
        rows = api(env, "GET", "/api/v1/containers", params={"all": "true"}).json()
        node = Node.of(home, {c["container_id"] for c in rows})
        live = {c["container_id"] for c in rows if c["status"] in ("starting", "ready", "stopping")}
        ok = set(node.runc) <= live and len(node.veths) == len(node.runc) == len(node.namespaces)
        return node if ok else None

    try:
        wait_until(consistent, timeout=RECOVERY_S, every=1)
    except AssertionError:
        rows = api(env, "GET", "/api/v1/containers", params={"all": "true"}).json()
        raise AssertionError(f"node and containers disagree: {Node.of(home, {c['container_id'] for c in rows})} "
                             f"vs {live_containers(env)}") from None


def test_sigkill_of_each_service_while_calls_flow(env):
    stack = stack_of(env)
    with Flow(env) as flow:
        wait_until(lambda: flow.ok_since(0) >= 5, timeout=60)
        for victim in SERVICES:
            # a request in flight when the victim dies: its events must all be handled after the restart
            asked = api(env, "POST", "/api/v1/containers", json={"cpu_millicores": 100, "memory_mib": 64})
            assert asked.status_code == 202, asked.text
            killed_at = time.monotonic()
            stack.kill_service(victim)
            cli(env, "up")  # restarts what is not running
            cid = asked.json()["container_id"]
            try:
                wait_until(lambda: handled(env, cid), timeout=RECOVERY_S)  # noqa: B023
            except AssertionError:
                raise AssertionError(f"the container requested before {victim} was killed was never handled: "
                                     f"{api(env, 'GET', f'/api/v1/containers/{cid}').json()}") from None
            report(f"sigkill {victim} request", handled_after_s=round(time.monotonic() - killed_at, 2))
            try:
                wait_until(lambda: flow.ok_since(killed_at) >= 3, timeout=RECOVERY_S)  # noqa: B023
            except AssertionError:
                raise AssertionError(f"no call served after {victim} was killed: {flow.last()}") from None
            report(f"sigkill {victim}", first_call_ok_after_s=round(flow.first_ok_after(killed_at) - killed_at, 2))
    wait_until(lambda: healthy(env), timeout=RECOVERY_S)
    # a call that failed said why (or the gateway itself was down): never a bare 500
    for code, text in flow.failures():
        assert code in (0, 502, 503, 504), (code, text)
        assert code == 0 or "detail" in text or "error" in text, (code, text)
    report("sigkill calls", calls=len(flow.outcomes), failed=len(flow.failures()))
    the_log_holds_each_event_once(env)
    settled_node_matches_containers(env)
    for name in SERVICES:  # a projection applied twice or missing an event differs from its rebuild
        doc = json.loads(cli(env, "projections", "rebuild", name, "--no-swap", "--json").stdout)
        assert doc["equal"], (name, doc)


def the_log_holds_each_event_once(env: dict) -> None:
    """No event twice; per container, at most one placement per attempt and, per placement, at most one
    start and one ready (a container re-requested after its worker was lost is placed again: attempt 2)."""
    log = events(env)
    ids = Counter(e["id"] for e in log)
    assert not [i for i, n in ids.items() if n > 1], "events in the log twice"
    placed = Counter((e["data"]["container_id"], e["data"]["attempt"]) for e in log if e["type"] == "ContainerScheduled")
    assert not {k: n for k, n in placed.items() if n > 1}, f"an attempt placed twice: {placed}"
    since_placed: dict[str, Counter] = {}
    for e in log:
        cid = e["data"].get("container_id")
        if e["type"] == "ContainerScheduled":
            since_placed[cid] = Counter()
        elif e["type"] in ("ContainerStarted", "ContainerReady") and cid in since_placed:
            since_placed[cid][e["type"]] += 1
            assert since_placed[cid][e["type"]] == 1, f"{e['type']} twice for one placement of {cid}"
    report("log", events=len(log), containers=len({c for c, _ in placed}), placements=len(placed))


def test_every_service_resumes_by_itself_after_nats_restarts(env):
    before = state_of(env)["components"]["nats"]
    with server_down(env, "nats"):
        time.sleep(2)  # long enough for every client to notice the connection is gone
    after = state_of(env)["components"]["nats"]
    assert (after["url"], after.get("auth")) == (before["url"], before.get("auth")), (before, after)
    back = time.monotonic()
    wait_until(lambda: healthy(env), timeout=RECOVERY_S, every=1)
    # through the log: the gateway publishes, the scheduler places, the worker starts, the gateway sees it
    r = api(env, "POST", "/api/v1/containers", json={"cpu_millicores": 100, "memory_mib": 64})
    assert r.status_code == 202, r.text
    wait_until(lambda: handled(env, r.json()["container_id"]), timeout=RECOVERY_S)
    wait_until(lambda: api(env, "POST", "/endpoint/hello", json={}).status_code == 200, timeout=RECOVERY_S)
    report("nats restart", down_s=2, resumed_after_s=round(time.monotonic() - back, 2))
    for name in SERVICES:  # each one's consumers read again: its health says connected
        url = state_of(env)["components"][name]["url"]
        assert httpx.get(f"{url}/healthz", timeout=5).json()["checks"]["nats"] == "ok", name


def test_every_service_resumes_by_itself_after_postgres_restarts(env):
    with server_down(env, "postgres"):
        time.sleep(2)
    back = time.monotonic()
    wait_until(lambda: healthy(env), timeout=RECOVERY_S, every=1)
    wait_until(lambda: api(env, "GET", "/api/v1/containers").status_code == 200, timeout=RECOVERY_S)
    wait_until(lambda: api(env, "POST", "/endpoint/hello", json={}).status_code == 200, timeout=RECOVERY_S)
    report("postgres restart", down_s=2, resumed_after_s=round(time.monotonic() - back, 2))


def test_a_sigkilled_worker_s_containers_are_replaced_once_it_is_back(env):
    """The worker holding every container is SIGKILLed and started again (`levers9 up`). Either the
    pool controller saw its process die and declared it lost (its containers are re-requested, and
    may be placed on it again once it is back), or its next start removed what the dead run left and
    said those containers failed: either way none of them stays 'ready' and calls get new containers
    on the restarted worker, the only one, and the node holds nothing of the old ones."""
    assert api(env, "POST", "/endpoint/hello", json={}).status_code == 200
    before = {c["container_id"] for c in live_containers(env) if c["status"] == "ready"}
    assert before, live_containers(env)
    killed_at = time.monotonic()
    stack_of(env).kill_service("worker")
    cli(env, "up")

    wait_until(lambda: api(env, "POST", "/endpoint/hello", json={}).status_code == 200, timeout=RECOVERY_S)
    report("worker sigkill",
           served_after_s=round(time.monotonic() - killed_at, 2), old_containers=len(before))
    settled_node_matches_containers(env)


def checkpoint_of(env: dict, deployment_prefix: str) -> dict | None:
    rows = [c for c in api(env, "GET", "/api/v1/checkpoints", params={"all": "true"}).json()
            if c["deployment_id"].startswith(deployment_prefix)]
    return rows[-1] if rows else None


def test_s3_down_for_30_s_fails_deploys_clearly_and_loses_no_checkpoint(env):
    """A checkpoint is dumped while the checkpoint-store is frozen (SIGSTOP), so that its upload meets
    the outage; SeaweedFS is then stopped for 30 s and the store thawed."""
    APPS = ROOT / "tests" / "e2e" / "apps"
    cli(env, "deploy", str(APPS / "stateful.py"))
    store, why = stack_of(env).check_pid("checkpoint-store")
    assert store is not None, why
    os.kill(store, signal.SIGSTOP)
    try:
        assert api(env, "POST", "/endpoint/stateful", json={}).status_code == 200
        wait_until(lambda: (checkpoint_of(env, "stateful-") or {}).get("status") == "dumped", timeout=RECOVERY_S)
        with Flow(env) as flow, server_down(env, "s3"):
            os.kill(store, signal.SIGCONT)  # its upload now meets the outage
            down_at = time.monotonic()
            t = time.monotonic()
            r = cli(env, "deploy", str(APPS / "probe.py"), check=False)
            deploy_s = time.monotonic() - t
            said = r.stdout + r.stderr
            assert r.returncode != 0 and "object store (S3)" in said and "retry" in said, said
            assert deploy_s < 60, f"a deploy with S3 down took {deploy_s:.0f} s to fail"
            time.sleep(max(0.0, 30 - (time.monotonic() - down_at)))
            held = checkpoint_of(env, "stateful-")
            assert held and held["status"] == "dumped", f"the checkpoint did not wait for S3: {held}"
            store_log = (Path(env["LEVERS9_HOME"]) / "logs" / "checkpoint-store.log").read_text()
            assert f"checkpoint {held['checkpoint_id']} waits for S3" in store_log, "its upload never met the outage"
            during = flow.ok_since(down_at)
            assert during > 0, f"no call was served while S3 was down: {flow.last()}"
    finally:
        os.kill(store, signal.SIGCONT)
    back = time.monotonic()
    stored = wait_until(lambda: (c := checkpoint_of(env, "stateful-")) and c["status"] != "dumped" and c,
                        timeout=RECOVERY_S, every=1)
    assert stored["status"] == "available", stored
    stored_s = time.monotonic() - back
    cli(env, "deploy", str(APPS / "probe.py"))  # deploys work again, nothing restarted
    for code, text in flow.failures():  # a call that failed said why: never a bare 500
        assert code in (502, 503, 504) and ("detail" in text or "error" in text), (code, text)
    report("s3 down", down_s=30, deploy_failed_in_s=round(deploy_s, 2), calls_ok_during=during,
           calls_failed=len(flow.failures()), checkpoint_stored_after_s=round(stored_s, 2))


def test_down_leaves_no_container_veth_namespace_or_mount(env):
    """Last in the module: `levers9 down` stops every container it ran and leaves nothing of them."""
    home = Path(env["LEVERS9_HOME"])
    ids = {c["container_id"] for c in api(env, "GET", "/api/v1/containers", params={"all": "true"}).json()}
    running = Node.of(home, ids)
    assert running.runc and running.veths, "the stack ran no container: the check below would prove nothing"
    cli(env, "down")
    after = Node.of(home, ids)
    assert after.runc == {}, f"runc containers left after `levers9 down`: {after.runc}"
    assert not after.veths, f"veths left: {after.veths}"
    assert not after.namespaces, f"namespaces left: {after.namespaces}"
    assert not after.mounts, f"mounts left under the home: {after.mounts}"
