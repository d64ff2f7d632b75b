"""GPU pools end to end with a configured inventory (no GPU on this machine): a pool `gpu` of H100 x 2
per worker, real runc containers.

The worker registers its cards as configured; a gpu_count=2 endpoint gets both cards in
NVIDIA_VISIBLE_DEVICES and levers9.distributed runs ranks 0 and 1 in it; two gpu_count=1 containers get
different cards; gpu_count=3 is not placed and says why; a GPU container with checkpoints on runs cold
and says why (no NVIDIA driver: configured inventory).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from _e2e import api, cli, needs_runc, wait_until

needs_runc()
pytestmark = pytest.mark.slow

APP = os.path.join(os.path.dirname(__file__), "apps", "gpu_app.py")
POOLS = ('[pools.gpu]\nbackend = "local"\ngpu_type = "H100"\ngpus_per_worker = 2\nmin_warm = 1\nmax_workers = 1\n'
         'idle_timeout_s = 600\nworker_cpu_millicores = 2000\nworker_memory_mib = 2048\n'
         '[pools.build]\nmin_warm = 0\nmax_workers = 1\ncriu = false\n')  # no builds here: no builder


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("l9gpu")
    (home / "pools.toml").write_text(POOLS)
    e = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    e.update(LEVERS9_HOME=str(home), LEVERS9_POOLS_FILE=str(home / "pools.toml"))
    try:
        cli(e, "up")
        wait_until(lambda: any(w["pool"] == "gpu" and w["status"] == "ready"
                               for w in api(e, "GET", "/api/v1/workers").json()), timeout=300)
        gpu = sorted(w["worker_id"] for w in api(e, "GET", "/api/v1/workers").json() if w["pool"] == "gpu")
        for extra in gpu[1:]:  # the pool controller may start a second warm worker at once (a race it has):
            cli(e, "workers", "cordon", extra)  # one worker, so the cards asked for are of that one node
        cli(e, "deploy", APP)
        yield e
    finally:
        cli(e, "down", check=False)


def call(env: dict, name: str) -> tuple[dict, str]:
    r = api(env, "POST", f"/endpoint/{name}", json={}, timeout=90)
    assert r.status_code == 200, r.text
    return r.json(), r.headers["x-levers9-container-id"]


def containers(env: dict) -> list[dict]:
    return json.loads(cli(env, "containers", "list", "--all", "--json").stdout)


def stop(env: dict, cid: str) -> None:
    cli(env, "containers", "stop", cid)
    wait_until(lambda: next(c for c in containers(env) if c["container_id"] == cid)["status"] == "stopped", 60)


def test_workers_list_shows_the_configured_inventory(env):
    workers = json.loads(cli(env, "workers", "list", "--json").stdout)
    gpu = [w for w in workers if w["pool"] == "gpu"]
    assert gpu, workers
    for w in gpu:
        assert (w["gpu_type"], w["gpu_count"], w["gpu_source"], w["gpu_ids"], w["gpu_driver"]) == \
            ("H100", 2, "configured", ["0", "1"], "")
    assert all(w["gpu_count"] == 0 and w["gpu_source"] == "" for w in workers if w["pool"] != "gpu")
    table = cli(env, "workers", "list").stdout
    assert "configured" in table and "H100" in table


def test_two_cards_and_one_rank_per_card(env):
    body, cid = call(env, "gpu-pair")
    assert sorted(body["devices"].split(",")) == ["0", "1"]
    ranks = body["ranks"]
    assert [(r["RANK"], r["LOCAL_RANK"], r["WORLD_SIZE"]) for r in ranks] == [("0", "0", "2"), ("1", "1", "2")]
    assert [r["CUDA_VISIBLE_DEVICES"] for r in ranks] == ["0", "1"]
    assert {r["MASTER_ADDR"] for r in ranks} == {"127.0.0.1"} and len({r["MASTER_PORT"] for r in ranks}) == 1
    log = cli(env, "containers", "logs", cid).stdout
    assert "levers9: GPUs 0,1 (H100, configured)" in log and "NVIDIA_VISIBLE_DEVICES only" in log
    stop(env, cid)  # its cards come back for the next tests


def test_two_single_card_containers_get_different_cards_and_no_checkpoint(env):
    with ThreadPoolExecutor(2) as pool:
        (a, cid_a), (b, cid_b) = pool.map(lambda name: call(env, name), ["gpu-one-a", "gpu-one-b"])
    assert sorted([a["devices"], b["devices"]]) == ["0", "1"]
    row = next(c for c in containers(env) if c["container_id"] == cid_a)
    assert "no NVIDIA driver detected (configured inventory)" in row["note"], row
    listed = json.loads(cli(env, "checkpoints", "list", "--json").stdout)
    assert not [c for c in listed if c["deployment_id"] == row["deployment_id"]]
    stop(env, cid_a)
    stop(env, cid_b)


def test_three_cards_are_not_placed_and_say_why(env):
    try:  # the gateway holds the call while the container waits for a place: it may answer late or not
        r = api(env, "POST", "/endpoint/gpu-three", json={}, timeout=3)
        assert r.status_code != 200, r.text
    except httpx.TimeoutException:
        pass
    deployment = next(d for d in json.loads(cli(env, "deployments", "list", "--json").stdout) if d["name"] == "gpu-three")
    row = wait_until(lambda: next((c for c in containers(env) if c["deployment_id"] == deployment["deployment_id"]
                                   and c["status"] == "pending"), None), timeout=30)
    assert "no worker has 3 free GPU(s) of H100" in row["reason"], row
    cli(env, "deployments", "stop", "gpu-three")
