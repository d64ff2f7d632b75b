"""Fixtures of the e2e tier: one running stack per lane, shared by the modules that need nothing of
their own from it (a worker that runs containers and can checkpoint, workspace `default`).

A module asks for `shared_env` and gets the stack reset: every deployment, secret and volume of
`default` deleted, its live containers stopped, and the worker ready with nothing placed on it. When
the reset cannot get there (a module left the stack broken, or another workspace's containers still
hold the worker), the stack is brought down and a fresh one started, so one module never fails the
next. Modules that break a stack on purpose, change its settings or assert on its whole event log
keep their own.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path

import pytest
from _e2e import api, one_worker_stack, wait_until

log = logging.getLogger("levers9.tests.shared_stack")

CPU_MILLICORES, MEMORY_MIB = 4000, 4096


class SharedStack:
    """A `one_worker_stack` that outlives modules: `fresh()` resets it, or starts it again."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory):
        self._tmp = tmp_path_factory
        self._exit = ExitStack()
        self.env: dict | None = None
        self.starts = 0

    def fresh(self) -> dict:
        if self.env is not None:
            try:
                reset(self.env)
                return dict(self.env)
            except Exception as err:  # noqa: BLE001 - any failure to reset means "start it again"
                log.warning("shared stack: reset failed (%s); starting a fresh one", err)
                self.close()
        self.starts += 1
        home: Path = self._tmp.mktemp(f"l9shared{self.starts}")
        self.env = self._exit.enter_context(one_worker_stack(home, CPU_MILLICORES, MEMORY_MIB))
        return dict(self.env)

    def close(self) -> None:
        self.env = None
        self._exit.close()
        self._exit = ExitStack()


def reset(env: dict, timeout: float = 120) -> None:
    """Workspace `default` back to nothing deployed, stored or running, on a ready worker; raises
    when that does not happen within `timeout`."""
    for d in api(env, "GET", "/api/v1/deployments").json():
        r = api(env, "DELETE", f"/api/v1/deployments/{d['name']}")
        assert r.status_code in (200, 404), r.text
    for kind in ("secrets", "volumes"):  # what a module counts starts from none
        for item in api(env, "GET", f"/api/v1/{kind}").json():
            r = api(env, "DELETE", f"/api/v1/{kind}/{item['name']}")
            assert r.status_code in (200, 404), r.text
    for c in api(env, "GET", "/api/v1/containers").json():
        api(env, "POST", f"/api/v1/containers/{c['container_id']}/stop")
    wait_until(lambda: not api(env, "GET", "/api/v1/containers").json(), timeout=timeout)
    # the worker, with every slot released (another workspace's containers included)
    wait_until(lambda: any(w["pool"] == "default" and w["status"] == "ready" and "runc" in w["features"]
                           and not w["cordoned"] and not w["draining"] and w["cpu_used"] == 0
                           for w in api(env, "GET", "/api/v1/workers").json()), timeout=timeout)


@pytest.fixture(scope="session")
def shared_stack(tmp_path_factory):
    stack = SharedStack(tmp_path_factory)
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture(scope="module")
def shared_env(shared_stack: SharedStack) -> dict:
    """The lane's shared stack, reset for this module: its env (LEVERS9_HOME and the rest)."""
    return shared_stack.fresh()
