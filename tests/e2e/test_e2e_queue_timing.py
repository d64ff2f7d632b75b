"""A deployment's wait queue and the Server-Timing header, end to end on the lane's shared stack
(`shared_env`, tests/e2e/conftest.py): a cold first call's header shows its container's placement and
start, a warm one's only the wait and the answer; with one container busy and its one queue place
taken, the next call gets 429 with Retry-After at once — before the calls ahead of it finish — and
the queued one is still served."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx
import pytest
from _e2e import api, cli, needs_runc

needs_runc()
pytestmark = pytest.mark.slow

APPS = Path(__file__).parent / "apps"


@pytest.fixture(scope="module")
def env(shared_env):
    cli(shared_env, "deploy", str(APPS / "queued.py"))
    return shared_env


def call(env: dict, hold: float = 0.0) -> httpx.Response:
    return api(env, "POST", "/endpoint/queued", json={"hold": hold}, timeout=120)


def timing(r: httpx.Response) -> dict[str, float]:
    """Server-Timing's metrics by name (their dur in ms)."""
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'([a-z-]+);dur=([0-9.]+)', r.headers.get("server-timing", ""))}


def test_a_cold_call_shows_its_start_and_a_warm_one_only_its_wait(env):
    cold = call(env)
    assert cold.status_code == 200, cold.text
    phases = timing(cold)
    assert {"queued", "first-byte"} <= set(phases) and ({"started", "restored"} & set(phases)), phases
    start = phases.get("started", phases.get("restored", 0.0)) + phases.get("placed", 0.0)
    assert 0 < start <= phases["queued"] + 0.2
    warm = call(env)
    assert warm.status_code == 200
    assert set(timing(warm)) == {"queued", "first-byte"}, warm.headers.get("server-timing")


def test_a_full_queue_answers_429_with_retry_after_before_the_calls_ahead_end(env):
    call(env)  # its container is ready
    done: list[tuple[float, int, str]] = []

    def one() -> None:
        r = call(env, hold=8.0)
        done.append((time.monotonic(), r.status_code, r.headers.get("retry-after", "")))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    statuses = sorted(s for _, s, _ in done)
    assert len(done) == 4 and statuses[:2] == [200, 200] and set(statuses[2:]) == {429}, done
    refused = [d for d in done if d[1] == 429]
    assert all(int(after) >= 1 for _, _, after in refused)
    first_served = min(at for at, status, _ in done if status == 200)
    assert all(at < first_served for at, _, _ in refused), "a 429 must come at once, not after a wait"
