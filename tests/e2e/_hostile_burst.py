"""Hostile-tenant cases: burst (collected through test_hostile_tenant.py, which holds the stack `hostile_env`).

- 20 concurrent first calls to an endpoint with max_containers=2, concurrency=4 (no container yet):
  every call answers 200, from at most 2 containers, and no more than 2 are ever asked for (each
  first call used to build a router of its own and ask for its own container: 10 to 15 started, and
  19 of the 20 calls waited 180 s for a 503).
"""

from __future__ import annotations

import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from _e2e import api, cli

APPS = Path(__file__).parent / "apps"
BURST = 20


def test_a_burst_of_first_calls_stays_within_max_containers_and_is_served(hostile_env):
    cli(hostile_env, "deploy", str(APPS / "burst.py"))
    assert not _burst_containers(hostile_env)  # first calls: nothing runs yet
    p = tomllib.loads((Path(hostile_env["LEVERS9_HOME"]) / "config.toml").read_text())
    headers = {"Authorization": f"Bearer {p['token']}"}

    def call(_: int) -> tuple[int, str, float]:
        t0 = time.monotonic()
        r = httpx.post(p["gateway_url"] + "/endpoint/burst", json={}, headers=headers, timeout=240)
        return r.status_code, r.text, time.monotonic() - t0

    with ThreadPoolExecutor(BURST) as pool:
        answers = list(pool.map(call, range(BURST)))
    failed = [(status, text) for status, text, _ in answers if status != 200]
    assert not failed, failed
    served_by = {httpx.Response(200, text=text).json()["container_id"] for _, text, _ in answers}
    ever = _burst_containers(hostile_env)
    assert len(ever) <= 2, ever  # every container asked for, whatever became of it
    assert served_by <= set(ever), (served_by, ever)
    print(f"burst: {BURST} first calls served by {len(served_by)} containers; slowest "
          f"{max(t for _, _, t in answers):.1f} s")


def _burst_containers(env: dict) -> dict[str, str]:
    """Every container the deployment `burst` has had (stopped and failed ones too) -> its status."""
    return {c["container_id"]: c["status"] for c in api(env, "GET", "/api/v1/containers?all=true").json()
            if c.get("deployment_name") == "burst"}
