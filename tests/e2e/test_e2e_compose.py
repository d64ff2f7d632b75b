"""docker-compose.yml end to end, with podman-compose: the platform team's one-machine install.

The image is built (scripts/build_image.sh: the local base images and the layer cache are reused when
present), `deploy_secrets compose` writes the credentials into a temporary project folder (a copy of
docker-compose.yml, with scripts/compose linked beside it: podman-compose reads `.env` from the compose
file's own folder and resolves `./` there), and the stack comes up under a project name of its own
on host ports from the port ledger. The test waits on conditions only (the gateway's /healthz, a
ready worker in GET /api/v1/workers), deploys examples/hello.py with the admin's generated token,
calls the endpoint (a runc container inside the privileged worker container) and checks its body.
`down -v` and `podman network rm` (podman-compose 1.0.3 leaves the network) must leave no container,
pod, volume or network of the project.

The worker's base root file system (debootstrap; podman's named volumes are nodev, which debootstrap
refuses) is bound from the host's image cache (L9_ROOTFS_CACHE); a machine without one gets it first
from the worker's own code (rootfs.ensure_base_rootfs: minutes, once per machine).

Durations are printed (`-s`) as one `compose timings:` line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from _e2e import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "levers9:local"
LABEL = "io.podman.compose.project"

if os.geteuid() != 0 or not shutil.which("podman") or not shutil.which("podman-compose"):
    pytest.skip("docker-compose.yml runs as root with podman and podman-compose (scripts/setup.sh --test "
                "installs them)", allow_module_level=True)


def _run(argv: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def _rootfs_cache(tmp: Path) -> Path:
    """The host's folder of base roots (<image_cache>/rootfs: the host's workers' own), with the
    worker's root in it."""
    from levers9.runtime.config import Settings
    from levers9.worker.runtime.runc import rootfs

    given = {k: v for k, v in os.environ.items() if k == "LEVERS9_IMAGE_CACHE"}
    cache = Path(Settings.load(env={"LEVERS9_HOME": str(tmp / "no-profile"), **given}).images.image_cache)
    rootfs.ensure_base_rootfs(cache)  # at once when it exists
    return rootfs.base_rootfs_path(cache).parent


def _project_folder(tmp: Path) -> Path:
    folder = tmp / "stack"
    (folder / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "docker-compose.yml", folder / "docker-compose.yml")
    (folder / "scripts" / "compose").symlink_to(ROOT / "scripts" / "compose")
    _run([sys.executable, "-m", "levers9.stack.deploy_secrets", "compose", str(folder)], timeout=120)
    return folder


def _leftovers(project: str) -> dict[str, list[str]]:
    lists = {
        "containers": ["podman", "ps", "-a", "-q", "--filter", f"label={LABEL}={project}"],
        "pods": ["podman", "pod", "ps", "-q", "--filter", f"label={LABEL}={project}"],
        "volumes": ["podman", "volume", "ls", "-q", "--filter", f"label={LABEL}={project}"],
        "networks": ["podman", "network", "ls", "-q", "--filter", f"label={LABEL}={project}"],
    }
    found = {what: _run(argv, timeout=60).stdout.split() for what, argv in lists.items()}
    # and by name, in case a version labels less
    found["volumes"] += [v for v in _run(["podman", "volume", "ls", "--format", "{{.Name}}"], timeout=60).stdout.split()
                         if v.startswith(f"{project}_")]
    found["networks"] += [n for n in _run(["podman", "network", "ls", "--format", "{{.Name}}"], timeout=60).stdout.split()
                          if n.startswith(f"{project}_")]
    found["pods"] += [p for p in _run(["podman", "pod", "ps", "--format", "{{.Name}}"], timeout=60).stdout.split()
                      if p == f"pod_{project}" or p.startswith(f"{project}_")]
    return {what: items for what, items in found.items() if items}


def _logs(project: str) -> str:
    out = []
    for name in _run(["podman", "ps", "-a", "--format", "{{.Names}}", "--filter", f"label={LABEL}={project}"],
                     timeout=60, check=False).stdout.split():
        logs = _run(["podman", "logs", "--tail", "15", name], timeout=60, check=False)
        out.append(f"--- {name}\n{(logs.stdout + logs.stderr)[-3000:]}")
    return "\n".join(out)


def test_compose_stack_deploys_and_calls_an_endpoint(tmp_path):
    from levers9.runtime.ports import free_ports

    timings: dict[str, float] = {}

    def timed(name: str, started: float) -> None:
        timings[name] = round(time.monotonic() - started, 1)

    started = time.monotonic()
    _run(["bash", "scripts/build_image.sh", IMAGE], timeout=2400, cwd=ROOT)
    timed("image", started)
    started = time.monotonic()
    cache = _rootfs_cache(tmp_path)
    timed("rootfs", started)

    folder = _project_folder(tmp_path)
    project = f"l9e2e{uuid.uuid4().hex[:10]}"
    gateway_port, grpc_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEVERS9_", "L9_", "REGISTRY_AUTH_FILE"))}
    env.update(L9_GATEWAY_PORT=str(gateway_port), L9_GRPC_PORT=str(grpc_port), L9_ROOTFS_CACHE=str(cache))
    compose = ["podman-compose", "-p", project]
    gateway = f"http://127.0.0.1:{gateway_port}"
    token = (folder / ".levers9-compose" / "token").read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    passed = False
    try:
        started = time.monotonic()
        _run([*compose, "up", "-d", "--no-build"], timeout=600, env=env, cwd=folder)
        timed("up", started)

        def healthy() -> bool:
            try:
                return httpx.get(f"{gateway}/healthz", timeout=3).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout=180, every=1)
        timed("gateway_healthy", started)

        def ready_worker() -> bool:
            try:
                reply = httpx.get(f"{gateway}/api/v1/workers", headers=auth, timeout=5)
            except httpx.HTTPError:
                return False
            return reply.status_code == 200 and any(w["status"] == "ready" for w in reply.json())

        wait_until(ready_worker, timeout=600, every=2)  # CRIU's private root: ~30 s at its first start
        timed("worker_ready", started)

        started = time.monotonic()
        cli_env = {**env, "LEVERS9_HOME": str(tmp_path / "home"), "LEVERS9_GATEWAY_URL": gateway,
                   "LEVERS9_TOKEN": token}
        deployed = _run([sys.executable, "-m", "levers9", "deploy", str(ROOT / "examples" / "hello.py")],
                        timeout=300, env=cli_env, cwd=tmp_path)
        assert "deployed hello" in deployed.stdout, deployed.stdout + deployed.stderr
        timed("deploy", started)

        started = time.monotonic()
        reply = httpx.post(f"{gateway}/endpoint/hello", headers=auth, json={"name": "compose"}, timeout=300)
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"message": "hello, compose"}
        timed("first_call", started)
        passed = True
    finally:
        if not passed:
            print(_logs(project))
        started = time.monotonic()
        down = _run([*compose, "down", "-v", "-t", "5"], timeout=600, env=env, cwd=folder, check=False)
        # podman-compose 1.0.3 leaves the project's network behind
        _run(["podman", "network", "rm", "-f", f"{project}_default"], timeout=120, check=False)
        timed("down", started)
        print("compose timings:", json.dumps(timings))
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
    assert _leftovers(project) == {}
