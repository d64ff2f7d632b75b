"""The worker's container runtimes: the pure parts (bundle, address allocation, mirror parsing,
exit reasons) and real containers (runc as root) and plain processes.

The real runc tests need root and runc; the base root file system is built once per machine into
the image cache (a couple of minutes), later runs reuse it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import pytest

from levers9.runtime.config import Settings
from levers9.worker import network, rootfs
from levers9.worker.network import AddressesExhausted, Ipam, Names, bridge_address, next_free_address
from levers9.worker.runc import (EXIT_FILE, LOG_FILE, RuncRuntime, bundle_spec, init_script,
                                 memory_cgroup_dir, oom_kills)
from levers9.worker.runtime import (ContainerSpec, Exit, ProcessRuntime, choose_runtime, exit_of,
                                    runc_missing)

MiB = 1024 * 1024

# a stand-in for the runner: stdlib HTTP on LEVERS9_RUNNER_HOST:LEVERS9_RUNNER_PORT that reports
# what it sees
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


async def wait_http(address: str, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2) as client:
        while True:
            try:
                return (await client.get(address + "/")).json()
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)


async def wait_exit(rt, container_id: str, timeout: float = 20) -> Exit:
    deadline = time.monotonic() + timeout
    while (ended := await rt.poll(container_id)) is None:
        assert time.monotonic() < deadline, f"{container_id} still runs after {timeout} s"
        await asyncio.sleep(0.05)
    return ended


# ---- pure: the bundle ----------------------------------------------------------------------------

def test_bundle_has_no_sys_and_points_stdio_inside(tmp_path):
    spec = spec_of(tmp_path, tmp_path, ("python3", "-m", "levers9.runner"))
    config = bundle_spec(spec, tmp_path / "rootfs", Path("/run/netns/l9-x"))
    assert not [m for m in config["mounts"] if m["destination"].startswith("/sys")]
    assert not [m for m in config["mounts"] if m["type"] in ("sysfs", "cgroup")]
    args = config["process"]["args"]
    assert args[:2] == ["/bin/sh", "-c"]
    assert args[2].startswith(f"exec </dev/null >>{LOG_FILE} 2>&1\n")
    assert "python3 -m levers9.runner &" in args[2]
    assert f">{EXIT_FILE}" in args[2]
    assert config["process"]["terminal"] is False
    assert config["process"]["cwd"] == "/app"
    assert config["root"] == {"path": str(tmp_path / "rootfs"), "readonly": False}


def test_bundle_limits_namespaces_and_privileges(tmp_path):
    spec = spec_of(tmp_path, tmp_path, ("true",), cpu_millicores=1500, memory_mib=64)
    config = bundle_spec(spec, tmp_path, Path("/run/netns/l9-x"))
    linux = config["linux"]
    assert linux["resources"]["memory"] == {"limit": 64 * MiB, "swap": 64 * MiB}
    assert linux["resources"]["cpu"] == {"quota": 150_000, "period": 100_000}
    assert linux["cgroupsPath"] == f"/levers9/{spec.container_id}"
    assert {"type": "network", "path": "/run/netns/l9-x"} in linux["namespaces"]
    assert {n["type"] for n in linux["namespaces"]} == {"pid", "ipc", "uts", "mount", "network"}
    assert config["process"]["noNewPrivileges"] is True
    assert config["process"]["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]
    assert "CAP_SYS_ADMIN" not in config["process"]["capabilities"]["bounding"]
    tiny = bundle_spec(spec_of(tmp_path, tmp_path, ("true",), cpu_millicores=1), tmp_path, Path("/n"))
    assert tiny["linux"]["resources"]["cpu"]["quota"] == 1000  # the kernel's minimum


def test_bundle_mounts_app_and_sdk_read_only_and_sets_env(tmp_path):
    code, sdk = tmp_path / "code", tmp_path / "sdk"
    spec = spec_of(code, sdk, ("true",), env={"HELLO": "world", "PYTHONPATH": "/app/lib"})
    config = bundle_spec(spec, tmp_path, Path("/n"))
    mounts = {m["destination"]: m for m in config["mounts"]}
    for dest, src in (("/app", code), ("/opt/levers9", sdk)):
        assert mounts[dest]["type"] == "bind" and mounts[dest]["source"] == str(src.resolve())
        assert "ro" in mounts[dest]["options"]
    assert {"/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue"} <= set(mounts)
    env = dict(e.split("=", 1) for e in config["process"]["env"])
    assert env["HELLO"] == "world" and env["HOME"] == "/root" and "/usr/bin" in env["PATH"]
    assert env["PYTHONPATH"] == "/opt/levers9:/app/lib"
    assert env["LEVERS9_RUNNER_PORT"] == "8000" and env["LEVERS9_RUNNER_HOST"] == "0.0.0.0"


def test_init_script_quotes_the_command():
    script = init_script(("python3", "-c", "print('a b'); import sys; sys.exit(3)"))
    app_line = [line for line in script.splitlines() if line.endswith(" &")][0]
    assert shlex.split(app_line[:-2]) == ["python3", "-c", "print('a b'); import sys; sys.exit(3)"]


def test_exit_reasons():
    assert exit_of(3) == Exit(3, "exited with status 3")
    assert exit_of(0) == Exit(0, "exited with status 0")
    assert exit_of(137, oom=True, memory_mib=64) == Exit(137, "killed: out of memory (limit 64 MiB)", True)
    assert exit_of(143, stop_requested=True) == Exit(143, "stopped")
    assert exit_of(137).reason == "killed by signal 9 (SIGKILL)"
    assert exit_of(None).code is None


def test_memory_cgroup_dir_v1_and_v2():
    v1 = ("30 25 0:27 / /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory\n"
          "35 25 0:32 / /sys/fs/cgroup/unified rw,relatime shared:17 - cgroup2 cgroup2 rw\n")
    assert memory_cgroup_dir("/levers9/a", v1) == Path("/sys/fs/cgroup/memory/levers9/a")
    v2 = "35 25 0:32 / /sys/fs/cgroup rw,relatime shared:17 - cgroup2 cgroup2 rw\n"
    assert memory_cgroup_dir("/levers9/a", v2) == Path("/sys/fs/cgroup/levers9/a")


def test_oom_kills_reads_v1_and_v2(tmp_path):
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert oom_kills(tmp_path) == 2
    (tmp_path / "memory.oom_control").unlink()
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert oom_kills(tmp_path) == 1
    assert oom_kills(tmp_path / "missing") == 0


# ---- pure: addresses -----------------------------------------------------------------------------

def test_next_free_address_skips_the_bridge_and_claims():
    assert str(bridge_address("10.209.0.0/24")) == "10.209.0.1/24"
    assert str(next_free_address("10.209.0.0/24", [])) == "10.209.0.2"
    assert str(next_free_address("10.209.0.0/24", ["10.209.0.2", "10.209.0.4"])) == "10.209.0.3"
    assert str(next_free_address("192.168.77.0/28", [f"192.168.77.{i}" for i in range(2, 14)])) \
        == "192.168.77.14"


def test_next_free_address_exhausted_says_so():
    with pytest.raises(AddressesExhausted, match="no free address left in 10.9.9.0/30"):
        next_free_address("10.9.9.0/30", ["10.9.9.2"])  # .1 is the bridge, .3 the broadcast
    with pytest.raises(network.NetworkError):
        bridge_address("10.9.9.0/31")


def test_names_fit_the_kernel_limit_and_differ_per_worker(tmp_path):
    a = Names.of(tmp_path / "w1", "x" * 128)
    b = Names.of(tmp_path / "w2", "x" * 128)
    assert a != b
    assert all(len(n) <= 15 for n in (a.netns, a.host_veth, a.peer_veth))


def test_ipam_claims_release_and_reclaims_stale(tmp_path):
    ipam = Ipam("br-test", "10.9.9.0/29", root=tmp_path)
    first = ipam.claim("a", tmp_path, "l9-a")
    second = ipam.claim("b", tmp_path, "l9-b")
    assert (first, second) == ("10.9.9.2", "10.9.9.3")
    assert json.loads((tmp_path / "br-test" / first).read_text())["container_id"] == "a"
    ipam.release(first, "someone-else")
    assert first in {c.ip for c in ipam.claims()}
    assert ipam.release_owned("a", tmp_path) == [first]
    assert ipam.claim("c", tmp_path, "l9-c") == first
    # a claim of a dead worker whose namespace is gone is reclaimed when the pool runs dry
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    for ip in ("10.9.9.4", "10.9.9.5", "10.9.9.6"):
        (tmp_path / "br-test" / ip).write_text(json.dumps(
            {"container_id": "gone", "pid": int(dead), "state_dir": "/x", "netns": "l9-nonexistent"}))
    assert ipam.claim("d", tmp_path, "l9-d") in ("10.9.9.4", "10.9.9.5", "10.9.9.6")
    ipam.claim("e", tmp_path, "l9-e")
    ipam.claim("f", tmp_path, "l9-f")
    with pytest.raises(AddressesExhausted):
        ipam.claim("g", tmp_path, "l9-g")


def _claim_many(args: tuple[str, int]) -> list[str]:
    root, n = args
    ipam = Ipam("br-race", "10.8.0.0/24", root=Path(root))
    return [ipam.claim(f"c{os.getpid()}-{i}", Path(root), "l9-x") for i in range(n)]


def test_ipam_is_safe_across_processes(tmp_path):
    with ProcessPoolExecutor(4) as pool:
        got = [ip for ips in pool.map(_claim_many, [(str(tmp_path), 20)] * 4) for ip in ips]
    assert len(got) == 80 and len(set(got)) == 80


# ---- pure: the Debian mirror from apt sources ----------------------------------------------------

ONE_LINE = """\
# deb http://old.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://updates.example/debian bookworm-updates main
deb [ trusted=yes ] http://mirror.example/debian bookworm main contrib  # the one
deb http://later.example/debian bookworm main
"""

DEB822 = """\
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm
Components: main

Types: deb
# a comment inside a stanza
URIs: http://mirror822.example/debian
  http://second.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_one_line_sources():
    assert rootfs.mirror_from_sources([("sources.list", ONE_LINE)]) == "http://mirror.example/debian"


def test_mirror_from_deb822_sources():
    assert rootfs.mirror_from_sources([("debian.sources", DEB822)]) == "http://mirror822.example/debian"


def test_mirror_takes_the_first_file_in_order_and_needs_main():
    files = [("a.list", "deb http://contrib.example/debian bookworm contrib\n"),
             ("b.sources", DEB822), ("c.list", ONE_LINE)]
    assert rootfs.mirror_from_sources(files) == "http://mirror822.example/debian"
    assert rootfs.mirror_from_sources([("x.list", "deb http://t.example/debian trixie main\n")]) is None


def test_host_mirror_reads_etc_apt(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    (tmp_path / "sources.list.d" / "ignored.list.disabled").write_text(ONE_LINE)
    assert rootfs.host_mirror(tmp_path) == "http://mirror822.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    with pytest.raises(rootfs.RootfsError, match="bookworm main"):
        rootfs.host_mirror(tmp_path)


def test_choose_runtime(tmp_path):
    rt, note = choose_runtime(Settings(runtime="process"), tmp_path)
    assert rt.name == "process" and rt.features == ["process"] and "no isolation" in note
    with pytest.raises(RuntimeError, match="unknown runtime"):
        choose_runtime(Settings(runtime="docker"), tmp_path)
    auto, note = choose_runtime(Settings(runtime="auto"), tmp_path)
    assert auto.name == ("process" if runc_missing() else "runc"), note


# ---- ProcessRuntime ------------------------------------------------------------------------------

async def test_process_runtime_start_poll_stop(tmp_path, app_dirs):
    code, sdk = app_dirs
    rt = ProcessRuntime(tmp_path / "worker", Settings(runtime="process"))
    await rt.prepare()
    spec = spec_of(code, sdk, ("python3", "app.py"))
    started = await rt.start(spec)
    assert started.address.startswith("http://127.0.0.1:")
    seen = await wait_http(started.address)
    assert seen["hello"] == "world" and seen["pythonpath"].startswith(str(sdk.resolve()))
    assert await rt.poll(spec.container_id) is None and rt.running() == [spec.container_id]
    ended = await rt.stop(spec.container_id, timeout=5)
    assert ended.reason == "stopped"
    assert "serving" in rt.log_path(spec.container_id).read_text()
    assert rt.running() == []

    three = spec_of(code, sdk, ("python3", "-c", "import sys; sys.exit(3)"))
    await rt.start(three)
    assert await wait_exit(rt, three.container_id) == Exit(3, "exited with status 3")
    await rt.stop(three.container_id)


# ---- RuncRuntime on real containers --------------------------------------------------------------

needs_runc = pytest.mark.skipif(bool(runc_missing()), reason=f"real containers: {runc_missing()}")


@pytest.fixture(scope="module")
async def runc_rt(tmp_path_factory):
    rt = RuncRuntime(tmp_path_factory.mktemp("worker"), Settings(runtime="runc"))
    await rt.prepare()  # the base root: minutes once per machine, then cached
    yield rt
    for cid in rt.running():
        await rt.stop(cid, timeout=1)


def assert_nothing_left(rt: RuncRuntime, container_id: str, ip: str) -> None:
    names = rt.names(container_id)
    assert not network.netns_path(names).exists(), "network namespace left"
    assert not Path("/sys/class/net", names.host_veth).exists(), "veth left"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(rt.container_dir(container_id)) not in mounts, "overlay still mounted"
    assert not rt.container_dir(container_id).exists()
    runc_list = subprocess.run([rt.runc, "--root", str(rt.runc_root), "list", "-q"],
                               capture_output=True, text=True, check=True).stdout.split()
    assert container_id not in runc_list, "runc container left"
    assert ip not in {c.ip for c in rt.ipam.claims()}, "address claim left"
    assert not (memory_cgroup_dir(f"/levers9/{container_id}") or Path("/nonexistent")).exists()


@needs_runc
async def test_container_serves_http_with_env_and_sees_only_app(runc_rt, app_dirs, tmp_path):
    code, sdk = app_dirs
    secret = Path("/tmp") / f"levers9-host-secret-{uuid.uuid4().hex}"
    secret.write_text("host only")
    try:
        spec = spec_of(code, sdk, ("python3", "/app/app.py"),
                       env={"HELLO": "world", "SECRET_PATH": str(secret), "CHECK_RO": "1"})
        started = await runc_rt.start(spec)
        seen = await wait_http(started.address)
    finally:
        secret.unlink()
    ip = started.address.split("//")[1].split(":")[0]
    assert seen["hello"] == "world"
    assert seen["pythonpath"] == "/opt/levers9"
    assert seen["secret_visible"] is False, "a host file outside /app is visible in the container"
    assert "app.py" in seen["app_files"]
    assert seen["app_writable"] is False, "/app must be read-only"
    cgroup = memory_cgroup_dir(f"/levers9/{spec.container_id}")
    assert int((cgroup / "memory.limit_in_bytes").read_text()) == 64 * MiB
    assert await runc_rt.poll(spec.container_id) is None
    assert spec.container_id in runc_rt.running()

    ended = await runc_rt.stop(spec.container_id, timeout=5)
    assert ended.reason == "stopped" and not ended.oom
    assert "serving" in runc_rt.log_path(spec.container_id).read_text()
    assert runc_rt.log_path(spec.container_id) == runc_rt.logs_dir / f"{spec.container_id}.log"
    assert_nothing_left(runc_rt, spec.container_id, ip)
    assert await runc_rt.stop(spec.container_id) == ended  # idempotent
    assert await runc_rt.poll(spec.container_id) == ended


@needs_runc
async def test_container_exit_status(runc_rt, app_dirs):
    code, sdk = app_dirs
    spec = spec_of(code, sdk, ("python3", "-c", "print('bye'); import sys; sys.exit(3)"))
    started = await runc_rt.start(spec)
    ended = await wait_exit(runc_rt, spec.container_id)
    assert ended == Exit(3, "exited with status 3")
    assert "bye" in started.log_path.read_text()
    assert await runc_rt.stop(spec.container_id) == ended
    assert "bye" in runc_rt.log_path(spec.container_id).read_text()


@needs_runc
async def test_container_out_of_memory(runc_rt, app_dirs):
    code, sdk = app_dirs
    spec = spec_of(code, sdk, ("python3", "/app/hog.py"), memory_mib=64)
    await runc_rt.start(spec)
    ended = await wait_exit(runc_rt, spec.container_id)
    assert ended.oom, ended
    assert "out of memory" in ended.reason and "64 MiB" in ended.reason
    assert "survived" not in runc_rt.log_path(spec.container_id).read_text()
    assert (await runc_rt.stop(spec.container_id)).oom


@needs_runc
async def test_two_containers_get_different_addresses(runc_rt, app_dirs):
    code, sdk = app_dirs
    specs = [spec_of(code, sdk, ("python3", "/app/app.py")) for _ in range(2)]
    started = await asyncio.gather(*(runc_rt.start(s) for s in specs))
    assert started[0].address != started[1].address
    for s in started:
        assert (await wait_http(s.address))["hello"] == "world"
    await asyncio.gather(*(runc_rt.stop(s.container_id) for s in specs))


@needs_runc
async def test_stop_kills_what_ignores_sigterm(runc_rt, app_dirs):
    code, sdk = app_dirs
    spec = spec_of(code, sdk, ("python3", "/app/stubborn.py"))
    started = await runc_rt.start(spec)
    deadline = time.monotonic() + 10
    while "ignoring" not in started.log_path.read_text():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    t0 = time.monotonic()
    ended = await runc_rt.stop(spec.container_id, timeout=0.5)
    assert ended.reason == "stopped" and time.monotonic() - t0 < 5


@needs_runc
async def test_cleanup_all_after_a_crash(runc_rt, app_dirs):
    code, sdk = app_dirs
    spec = spec_of(code, sdk, ("python3", "/app/app.py"))
    started = await runc_rt.start(spec)
    ip = started.address.split("//")[1].split(":")[0]
    # a new worker process on the same state dir (the old one "crashed")
    successor = RuncRuntime(runc_rt.state_dir, runc_rt.settings)
    await successor.prepare()
    assert successor.running() == []
    left = await successor.cleanup_all()
    assert spec.container_id in left
    assert_nothing_left(successor, spec.container_id, ip)
    runc_rt._live.pop(spec.container_id)  # the crashed one's memory
