"""The dashboard as a process (`levers9 service dashboard`, as `levers9 up` starts it) against the
FAKE gateway (tests/fakes): it answers /healthz, serves a browser that signed in through
`levers9 dashboard`'s link, and stops at once on SIGTERM with an /events stream open. Also: the
stack lists it as a component `dashboard`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
from fakes.fake_gateway import FakeGateway, serving
from typer.testing import CliRunner

from levers9.cli import app as cli_app
from levers9.runtime.config import Settings
from levers9.runtime.ports import free_port
from levers9.stack import Stack


async def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    async with httpx.AsyncClient(trust_env=False) as c, asyncio.timeout(timeout):
        while True:
            assert proc.poll() is None, "the dashboard exited"
            try:
                if (await c.get(f"{url}/healthz", timeout=1)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)  # polling its /healthz, as `levers9 up` does


@pytest.mark.asyncio(loop_scope="function")
async def test_the_process_serves_signs_in_and_stops_on_sigterm(tmp_path):
    gw = FakeGateway()
    async with serving(gw.app) as gateway_url:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
        env.update({"LEVERS9_HOME": str(tmp_path), "LEVERS9_GATEWAY_URL": gateway_url, "LEVERS9_HTTP_PORT": str(port),
                    "LEVERS9_SERVICE": "dashboard"})
        log = open(tmp_path / "dashboard.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "levers9", "service", "dashboard"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            await wait_healthy(url, proc)
            (tmp_path / "state.json").write_text('{"components": {"dashboard": {"url": "%s"}}}' % url)
            result = await asyncio.to_thread(CliRunner().invoke, cli_app, ["dashboard", "--json"],
                                             env={**env, "LEVERS9_TOKEN": "tok-a"})
            assert result.exit_code == 0, result.output
            link = json.loads(result.stdout)["url"]
            assert link.startswith(f"{url}/signin?ticket=")
            async with httpx.AsyncClient(trust_env=False) as c:
                assert (await c.get(link)).status_code == 303
                assert (await c.get(f"{url}/api/me")).json()["workspace"] == "ws-a"
                async with c.stream("GET", f"{url}/events") as stream:
                    assert stream.status_code == 200
                    proc.send_signal(signal.SIGTERM)
                    # it ends the open stream and exits cleanly; uvicorn alone would wait for the
                    # stream to end forever (the ceiling is generous: a loaded machine is slow, not stuck)
                    code = await asyncio.to_thread(proc.wait, 120)
                    assert code == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        assert b"dashboard started" in (tmp_path / "dashboard.log").read_bytes()


def test_the_stack_lists_the_dashboard(tmp_path):
    settings = Settings.load(env={"LEVERS9_HOME": str(tmp_path)}, profile=tmp_path / "config.toml")
    names = [c.name for c in Stack(tmp_path, settings).status()]
    assert names[-1] == "dashboard" and "gateway" in names
