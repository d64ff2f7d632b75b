"""The worker's container runtimes on real processes and containers.

`RuntimeContract` is what EVERY runtime must do (an abstract test case, run once per runtime):
start -> the address answers, env reaches the app, poll reports an exit with its status, stop
returns an exit (idempotent), SIGTERM-ignoring apps are killed, logs outlive the container,
cleanup_all removes what a crashed worker left, and out of memory is reported where the runtime
enforces a limit. It runs over `process` (always) and `runc` (root and runc needed; skipped with
the reason otherwise). Below it, what only one runtime does (runc's isolation and limits).

The runc tests build the base root file system once per machine into the image cache (a couple of
minutes); later runs reuse it. The pure parts (bundle, addresses, mirror) are in tests/unit.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from levers9.runtime.config import Settings
from levers9.worker.network import bridge as network
from levers9.worker.runtime.choice import runc_missing
from levers9.worker.runtime.interface import ContainerSpec, Exit, Runtime, Started, proc_state
from levers9.worker.runtime.process import ProcessRuntime
from levers9.worker.runtime.runc.cgroups import memory_cgroup_dir
from levers9.worker.runtime.runc.runc_runtime import RuncRuntime

MiB = 1024 * 1024

# a stand-in for the runner: stdlib HTTP on LEVERS9_RUNNER_HOST:LEVERS9_RUNNER_PORT that reports
# what it sees (on any path, /_levers9/health included)
APP = r'''
import http.server, json, os

def app_writable():
    try:
        open("/app/probe", "w").close()
        return True
    except OSError:
        return False

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        secret = os.environ.get("SECRET_PATH", "")
        body = json.dumps({
            "hello": os.environ.get("HELLO"),
            "pythonpath": os.environ.get("PYTHONPATH"),
            "secret_visible": bool(secret) and os.path.exists(secret),
            "app_files": sorted(os.listdir(".")),
            "app_writable": app_writable() if os.environ.get("CHECK_RO") else None,
        }).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

print("serving", flush=True)
http.server.ThreadingHTTPServer(
    (os.environ.get("LEVERS9_RUNNER_HOST", "0.0.0.0"), int(os.environ.get("LEVERS9_RUNNER_PORT", "8000"))),
    Handler).serve_forever()
'''

HOG = r'''
import time
chunks = []
print("allocating", flush=True)
for i in range(400):
    chunks.append(bytes([i % 251]) * (1024 * 1024))  # written, so resident
print("survived", flush=True)
time.sleep(60)
'''

STUBBORN = r'''
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM", flush=True)
while True:
    time.sleep(1)
'''


def spec_of(code_dir: Path, sdk_dir: Path, command: tuple[str, ...], **kw) -> ContainerSpec:
    values = dict(container_id=f"t-{uuid.uuid4().hex[:12]}", code_dir=code_dir, sdk_dir=sdk_dir,
                  env={"HELLO": "world"}, cpu_millicores=500, memory_mib=64, command=command)
    values.update(kw)
    return ContainerSpec(**values)


@pytest.fixture(scope="module")
def app_dirs(tmp_path_factory) -> tuple[Path, Path]:
    code = tmp_path_factory.mktemp("code")
    (code / "app.py").write_text(APP)
    (code / "hog.py").write_text(HOG)
    (code / "stubborn.py").write_text(STUBBORN)
    sdk = tmp_path_factory.mktemp("sdk")
    (sdk / "levers9").mkdir()
    (sdk / "levers9" / "__init__.py").write_text("")
    return code, sdk


async def wait_http(address: str, path: str = "/", timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2) as client:
        while True:
            try:
                return (await client.get(address + path)).json()
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)


async def wait_exit(rt: Runtime, container_id: str, timeout: float = 20) -> Exit:
    deadline = time.monotonic() + timeout
    while (ended := await rt.poll(container_id)) is None:
        assert time.monotonic() < deadline, f"{container_id} still runs after {timeout} s"
        await asyncio.sleep(0.05)
    return ended


def ip_of(address: str) -> str:
    return address.split("//")[1].split(":")[0]


def assert_nothing_left_runc(rt: RuncRuntime, container_id: str, started: Started) -> None:
    names = rt.names(container_id)
    assert not network.netns_path(names).exists(), "network namespace left"
    assert not Path("/sys/class/net", names.host_veth).exists(), "veth left"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(rt.container_dir(container_id)) not in mounts, "overlay still mounted"
    assert not rt.container_dir(container_id).exists()
    runc_list = subprocess.run([rt.runc, "--root", str(rt.runc_root), "list", "-q"],
                               capture_output=True, text=True, check=True).stdout.split()
    assert container_id not in runc_list, "runc container left"
    assert ip_of(started.address) not in {c.ip for c in rt.ipam.claims()}, "address claim left"
    assert not (memory_cgroup_dir(f"/levers9/{container_id}") or Path("/nonexistent")).exists()


def assert_nothing_left_process(rt: ProcessRuntime, container_id: str, started: Started) -> None:
    deadline = time.monotonic() + 5  # SIGKILL is sent, not yet delivered, when kill() returns
    while proc_state(started.pid) not in (None, "Z", "X"):
        assert time.monotonic() < deadline, "the app's process still runs"
        time.sleep(0.01)
    assert not (rt.containers_dir / container_id).exists(), "container dir left"


@dataclass
class Kind:
    """How the contract drives one runtime: make it, and check that nothing of a container is left."""
    name: str
    make: type[Runtime]
    nothing_left: object  # (rt, container_id, started) -> None, asserts


KINDS = {"process": Kind("process", ProcessRuntime, assert_nothing_left_process),
         "runc": Kind("runc", RuncRuntime, assert_nothing_left_runc)}


@pytest.fixture(params=list(KINDS))
async def kind(request) -> Kind:
    if request.param == "runc" and runc_missing():
        pytest.skip(f"the runc runtime needs real containers: {runc_missing()}")
    return KINDS[request.param]


@pytest.fixture
async def rt(kind: Kind, tmp_path):
    """A fresh runtime on its own state dir (runc's base root is built once per machine, then cached)."""
    runtime = kind.make(tmp_path / "worker", Settings().with_(runtime=kind.name))
    await runtime.prepare()
    yield runtime
    for cid in runtime.running():
        await runtime.stop(cid, timeout=1)


# ---- the contract: every runtime -----------------------------------------------------------------

class RuntimeContract:
    """What every worker runtime must do; `rt` is the runtime under test, `kind` how to inspect it."""

    async def test_start_answers_health_and_env_reaches_the_app(self, rt: Runtime, app_dirs):
        code, sdk = app_dirs
        spec = spec_of(code, sdk, ("python3", "app.py"))  # relative: the app's dir is the cwd
        started = await rt.start(spec)
        assert started.address.startswith("http://") and started.pid > 0
        seen = await wait_http(started.address, "/_levers9/health")
        assert seen["hello"] == "world"
        assert "app.py" in seen["app_files"]
        assert await rt.poll(spec.container_id) is None and rt.running() == [spec.container_id]
        await rt.stop(spec.container_id, timeout=5)

    async def test_stop_returns_an_exit_keeps_the_log_and_is_idempotent(self, rt: Runtime, app_dirs):
        code, sdk = app_dirs
        spec = spec_of(code, sdk, ("python3", "app.py"))
        started = await rt.start(spec)
        await wait_http(started.address)
        ended = await rt.stop(spec.container_id, timeout=5)
        assert ended.reason == "stopped" and not ended.oom
        assert rt.running() == []
        assert rt.log_path(spec.container_id).exists()
        assert "serving" in rt.log_path(spec.container_id).read_text()
        assert rt.log_path(spec.container_id) == rt.logs_dir / f"{spec.container_id}.log"
        assert await rt.stop(spec.container_id) == ended  # idempotent
        assert await rt.poll(spec.container_id) == ended

    async def test_poll_reports_an_exited_container(self, rt: Runtime, app_dirs):
        code, sdk = app_dirs
        spec = spec_of(code, sdk, ("python3", "-c", "print('bye'); import sys; sys.exit(3)"))
        started = await rt.start(spec)
        ended = await wait_exit(rt, spec.container_id)
        assert ended == Exit(3, "exited with status 3")
        assert "bye" in started.log_path.read_text()
        assert await rt.stop(spec.container_id) == ended
        assert "bye" in rt.log_path(spec.container_id).read_text()

    async def test_two_containers_get_different_addresses(self, rt: Runtime, app_dirs):
        code, sdk = app_dirs
        specs = [spec_of(code, sdk, ("python3", "app.py")) for _ in range(2)]
        started = await asyncio.gather(*(rt.start(s) for s in specs))
        assert started[0].address != started[1].address
        for s in started:
            assert (await wait_http(s.address))["hello"] == "world"
        await asyncio.gather(*(rt.stop(s.container_id) for s in specs))

    async def test_stop_kills_what_ignores_sigterm(self, rt: Runtime, app_dirs):
        code, sdk = app_dirs
        spec = spec_of(code, sdk, ("python3", "stubborn.py"))
        started = await rt.start(spec)
        deadline = time.monotonic() + 10
        while "ignoring" not in started.log_path.read_text():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        ended = await rt.stop(spec.container_id, timeout=0.5)
        assert ended.reason == "stopped" and time.monotonic() - t0 < 5

    async def test_cleanup_all_after_a_crash(self, rt: Runtime, kind: Kind, app_dirs):
        code, sdk = app_dirs
        spec = spec_of(code, sdk, ("python3", "app.py"))
        started = await rt.start(spec)
        await wait_http(started.address)
        # a new worker process on the same state dir (the old one "crashed")
        successor = kind.make(rt.state_dir, rt.settings)
        await successor.prepare()
        assert successor.running() == []
        left = await successor.cleanup_all()
        assert spec.container_id in left
        kind.nothing_left(successor, spec.container_id, started)
        assert await successor.cleanup_all() == []
        # the kill takes a moment to land: stopping before it has would make this a requested stop
        for _ in range(250):
            if await rt.poll(spec.container_id) is not None:
                break
            await asyncio.sleep(0.02)
        ended = await rt.stop(spec.container_id, timeout=1)  # the crashed one's memory: killed meanwhile
        assert "killed" in ended.reason and not ended.oom, ended

    async def test_out_of_memory_is_reported(self, rt: Runtime, app_dirs):
        if not rt.enforces_memory_limit:
            pytest.skip(f"the {rt.name} runtime enforces no memory limit")
        code, sdk = app_dirs
        spec = spec_of(code, sdk, ("python3", "hog.py"), memory_mib=64)
        await rt.start(spec)
        ended = await wait_exit(rt, spec.container_id)
        assert ended.oom, ended
        assert "out of memory" in ended.reason and "64 MiB" in ended.reason
        assert "survived" not in rt.log_path(spec.container_id).read_text()
        assert (await rt.stop(spec.container_id)).oom


class TestEveryRuntime(RuntimeContract):
    """The contract, once per runtime (the `kind` fixture's params)."""


# ---- the process runtime only --------------------------------------------------------------------

async def test_process_runtime_puts_the_sdk_first_on_pythonpath(tmp_path, app_dirs):
    code, sdk = app_dirs
    rt = ProcessRuntime(tmp_path / "worker", Settings().with_(runtime="process"))
    await rt.prepare()
    spec = spec_of(code, sdk, ("python3", "app.py"))
    started = await rt.start(spec)
    assert started.address.startswith("http://127.0.0.1:")
    seen = await wait_http(started.address)
    assert seen["pythonpath"].startswith(str(sdk.resolve()))
    await rt.stop(spec.container_id, timeout=5)


# ---- the runc runtime only: isolation and limits -------------------------------------------------

needs_runc = pytest.mark.skipif(bool(runc_missing()), reason=f"real containers: {runc_missing()}")


@needs_runc
async def test_runc_container_sees_only_its_app_with_limits(tmp_path, app_dirs):
    code, sdk = app_dirs
    rt = RuncRuntime(tmp_path / "worker", Settings().with_(runtime="runc"))
    await rt.prepare()
    secret = Path("/tmp") / f"levers9-host-secret-{uuid.uuid4().hex}"
    secret.write_text("host only")
    try:
        spec = spec_of(code, sdk, ("python3", "/app/app.py"),
                       env={"HELLO": "world", "SECRET_PATH": str(secret), "CHECK_RO": "1"})
        started = await rt.start(spec)
        seen = await wait_http(started.address)
    finally:
        secret.unlink()
    assert seen["hello"] == "world"
    assert seen["pythonpath"] == "/opt/levers9"
    assert seen["secret_visible"] is False, "a host file outside /app is visible in the container"
    assert seen["app_writable"] is False, "/app must be read-only"
    cgroup = memory_cgroup_dir(f"/levers9/{spec.container_id}")
    assert int((cgroup / "memory.limit_in_bytes").read_text()) == 64 * MiB
    ended = await rt.stop(spec.container_id, timeout=5)
    assert ended.reason == "stopped"
    assert_nothing_left_runc(rt, spec.container_id, started)
