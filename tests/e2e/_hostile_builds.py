"""Hostile-tenant cases: builds and package installs (collected through test_hostile_tenant.py,
which holds the stack `hostile_env`).

- a function's `packages=` names the package the tenant shipped in its own code by its path on the
  worker host (`file://<where the worker unpacked the code>/evilpkg`): its setup.py would write a
  marker on the host and read the host's secrets; nothing of it may run on the host;
- the same package named by its path in the container (`file:///app/evilpkg`): it installs, and its
  setup.py ran in the install container (not the host's name, no host file readable, the marker
  nowhere on the host), and the sandbox imports it;
- an image build step probes every control-plane port and the host's addresses: nothing connects,
  and the step still reaches the package index (the build installs its package).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

from _e2e import api, cli, wait_until

APPS = Path(__file__).parent / "apps"

SETUP = '''import json, os, socket, tempfile
from setuptools import setup
record = {{"hostname": socket.gethostname(), "uid": os.getuid(), "pid1": open("/proc/1/comm").read().strip()}}
try:
    record["host_file"] = open({secret!r}).read()[:40]
except OSError as exc:
    record["host_file"] = type(exc).__name__
try:
    os.makedirs(os.path.dirname({marker!r}), exist_ok=True)
    open({marker!r}, "w").write(json.dumps(record))
except OSError:
    pass
for cache in ("/var/lib/levers9/packages",):
    if os.path.isdir(cache):
        with open(os.path.join(cache, {record!r}), "w") as f:
            json.dump(record, f)
work = tempfile.mkdtemp(prefix="evil-")  # /app is read-only: build outside it
setup(name="levers9-evil-{token}", version="0.1", packages=["evilmod"],
      options={{"egg_info": {{"egg_base": work}}, "build": {{"build_base": os.path.join(work, "build")}},
               "bdist_wheel": {{"bdist_dir": os.path.join(work, "bdist")}}}})
'''


def _evil_app(tmp: Path, home: Path) -> dict:
    """The app's directory: the function, and the package whose setup.py is the attack."""
    token = uuid.uuid4().hex[:10]
    marker = Path("/tmp") / f"levers9-hostile-{token}" / "ran-on-the-host"
    secret = next((str(p) for p in (home / "secrets.key", home / "config.toml") if p.exists()), "/etc/shadow")
    shutil.copy(APPS / "hostile_packages.py", tmp / "app.py")
    (tmp / "evilpkg" / "evilmod").mkdir(parents=True)
    (tmp / "evilpkg" / "evilmod" / "__init__.py").write_text("EVIL = True\n")
    record = f"hostile-{token}.json"
    (tmp / "evilpkg" / "setup.py").write_text(SETUP.format(secret=secret, marker=str(marker), record=record,
                                                          token=token))
    return {"dir": tmp, "marker": marker, "record": record, "token": token}


def _deploy(env: dict, app: dict, packages: str) -> None:
    cli({**env, "HOSTILE_PACKAGES": packages}, "deploy", str(app["dir"] / "app.py"))


def _call(env: dict):
    return api(env, "POST", "/function/hostile-packages/probe", json={}, timeout=900)


def _root_processes_with(token: str) -> list[str]:
    """Host processes whose command line names the token, outside any container (this pid namespace)."""
    mine = os.readlink("/proc/self/ns/pid")
    out = subprocess.run(["pgrep", "-af", token], capture_output=True, text=True).stdout.splitlines()
    return [line for line in out if line.split()[0].isdigit()
            and _pidns(int(line.split()[0])) == mine and "pgrep" not in line]


def _pidns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def test_a_package_named_by_its_host_path_never_runs_on_the_host(hostile_env, tmp_path):
    home = Path(hostile_env["LEVERS9_HOME"])
    app = _evil_app(tmp_path, home)
    _deploy(hostile_env, app, "")
    first = _call(hostile_env)  # the worker unpacks the code: its host path is now known
    assert first.status_code == 200, first.text
    shipped = wait_until(lambda: next((p.parent for p in home.glob("workers/*/code/*/evilpkg/setup.py")
                                       if app["token"] in p.read_text()), None), timeout=60)
    _deploy(hostile_env, app, f"levers9-evil-{app['token']} @ file://{shipped}")
    try:
        r = _call(hostile_env)
        assert not app["marker"].exists(), f"setup.py ran on the host: {app['marker'].read_text()}"
        assert not _root_processes_with(app["token"])
        # the install ran confined: the host path is not there (it fails), and says so without host paths
        assert r.status_code != 200 or not r.json().get("result", {}).get("imported"), r.text
        print(r.status_code, r.text[:2000])
        assert str(home) not in r.text.replace(str(shipped), "")  # but the tenant's own requirement, echoed
    finally:
        shutil.rmtree(app["marker"].parent, ignore_errors=True)


def test_a_shipped_package_installs_and_its_setup_py_runs_only_in_the_install_container(hostile_env, tmp_path):
    home = Path(hostile_env["LEVERS9_HOME"])
    app = _evil_app(tmp_path, home)
    _deploy(hostile_env, app, f"levers9-evil-{app['token']} @ file:///app/evilpkg")
    try:
        r = _call(hostile_env)
        assert r.status_code == 200, r.text
        result = r.json()["result"]
        print(json.dumps(result, indent=1))
        record = result["records"].get(app["record"])
        assert result["imported"] is True  # the sandbox found the install and imports it
        assert record, "setup.py left no record in the install cache"
        assert record["hostname"] != socket.gethostname()  # it ran in a container of its own ...
        assert record["host_file"] in ("FileNotFoundError", "PermissionError")  # ... that sees no host file
        assert record["pid1"] != open("/proc/1/comm").read().strip()
        assert not app["marker"].exists(), "setup.py wrote on the host"
    finally:
        shutil.rmtree(app["marker"].parent, ignore_errors=True)


def test_a_build_step_reaches_no_control_plane_port_and_no_host_address_but_the_index(hostile_env):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_e2e_isolation import host_addresses, stack_ports

    ports = stack_ports(hostile_env)
    assert {"nats", "s3", "registry", "gateway"} <= set(ports), ports
    addresses = sorted({"127.0.0.1", *host_addresses()})
    targets = [f"{a}:{p}" for a in addresses for p in sorted(set(ports.values()))]
    env = {**hostile_env, "HOSTILE_TARGETS": json.dumps(targets)}
    cli(env, "deploy", str(APPS / "hostile_build.py"), timeout=1800)
    r = api(env, "POST", "/function/hostile-build/probe", json={}, timeout=900)
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    probe = result["probe"]
    print(json.dumps({"ports": ports, **result}, indent=1))
    # the one way out: the worker's egress proxy, which listens on the bridge's address only
    from levers9.runtime.config import Settings
    from levers9.worker.network.bridge import bridge_address

    bridge = str(bridge_address(Settings.load(hostile_env).network.bridge_subnet).ip)
    proxies = {k.split()[-1] for k in ports if k.startswith("worker[") and k.split()[-1].startswith(f"{bridge}:")}
    assert {t for t in targets if probe.get(t) == "connected"} <= proxies, probe
    assert set(targets) <= set(probe)
    assert probe["index"] == 200, probe  # the package index, through the worker's egress proxy
    assert result["humanize"] == "3.0 MB"
