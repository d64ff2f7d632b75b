"""A stack under light traffic keeps a flat number of consumers on every stream (the short form of
bench/soak.py, which also watches RSS for ten minutes).

The pool controller once listed the heartbeat bucket's keys on every pass, and every listing left a
JetStream consumer behind on KV_levers9_heartbeats: about one per pass, until the server's limit made
the listing fail. Here half a minute of calls (one every 0.5 s) and `levers9 status` runs span a dozen and more
pool-controller passes (one at least every 2 s), and no stream may end with more consumers than it
started with."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx
import pytest
from _e2e import wait_until

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from soak import SoakStack, consumer_problems  # noqa: E402

pytestmark = pytest.mark.slow

if os.geteuid() != 0 or not any(Path(p, "runc").exists() for p in os.environ.get("PATH", "").split(":")):
    pytest.skip("runc containers need root and runc (scripts/setup.sh installs runc)", allow_module_level=True)

CALLS = 50  # at one call every 0.5 s: about half a minute, a dozen pool-controller passes and more


def pool_controller_health(home: Path) -> dict:
    url = json.loads((home / "state.json").read_text())["components"]["pool-controller"]["url"]
    return httpx.get(f"{url}/healthz", timeout=5).json()


def test_consumers_stay_flat_under_light_traffic(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(tmp_path, 0o755)  # postgres runs as another account and must traverse it
    with SoakStack(home) as stack:
        traffic = stack.traffic()
        try:
            wait_until(lambda: len(traffic.calls) >= 10 and traffic.statuses, timeout=60)
            wait_until(lambda: pool_controller_health(home)["heartbeats"]["current"], timeout=30)
            first = stack.sample("start")
            wait_until(lambda: len(traffic.calls) >= 10 + CALLS and len(traffic.statuses) >= 6, timeout=180)
            last = stack.sample("end")
            health = pool_controller_health(home)
        finally:
            traffic.finish()
    assert not consumer_problems(first, last), (first.consumers, last.consumers)
    assert "KV_levers9_heartbeats" in last.consumers and "LEVERS9" in last.consumers
    assert last.consumers["KV_levers9_heartbeats"] <= 1, last.consumers  # the pool controller's one watcher
    # the watcher is up and has not needed re-creating: a quiet, connected stack needs one
    assert health["heartbeats"]["current"] and health["heartbeats"]["watchers_created"] == 1, health
    assert health["heartbeats"]["workers"] >= 1, health  # local-1 beats
    assert not traffic.errors, traffic.errors[:5]
    assert all(code == 0 for code in traffic.statuses), (traffic.statuses, traffic.unhealthy[:2])
