"""A function's `packages=` installed in a real install container (runc, root; no stack): the
tenant's own package (its setup.py records where it ran and tries to write on the host) and one from
the index through the worker's egress proxy, on a bridge of the test's own. The install lands in the
workspace's cache under the key the sandbox computes; nothing of it runs on the host."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import uuid
from pathlib import Path

import pytest

import levers9
from levers9.executor import packages
from levers9.runtime.config import Settings
from levers9.worker.network import bridge as network
from levers9.worker.network import firewall
from levers9.worker.runtime.interface import ContainerSpec
from levers9.worker.runtime.runc.rootfs import base_rootfs_path
from levers9.worker.sandboxes.sandboxes import Sandboxes, install_spec, run_job

IMAGE_CACHE = Path(os.environ.get("LEVERS9_IMAGE_CACHE") or "/var/cache/levers9")
BRIDGE, SUBNET = "l9inst0", "10.219.10.0/28"

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runc") or firewall.nft_missing() is not None,
                                 reason="install containers need root, runc and nft"),
              pytest.mark.skipif(not base_rootfs_path(IMAGE_CACHE).is_dir(), reason="no base root fs (a worker makes it)")]

SETUP = """import json, os, socket, tempfile
from setuptools import setup
record = {{"hostname": socket.gethostname(), "uid": os.getuid()}}
try:
    os.makedirs({marker!r}, exist_ok=True)
except OSError:
    pass
with open("/var/lib/levers9/packages/record.json", "w") as f:
    json.dump(record, f)
work = tempfile.mkdtemp()
setup(name="l9evil", version="0.1", packages=["evilmod"], options={{"egg_info": {{"egg_base": work}},
      "build": {{"build_base": work + "/b"}}, "bdist_wheel": {{"bdist_dir": work + "/w"}}}})
"""


async def test_packages_install_in_a_confined_container_into_the_sandboxes_cache(tmp_path):
    from levers9.worker.runtime.runc.runc_runtime import RuncRuntime

    marker = Path("/tmp") / f"levers9-install-{uuid.uuid4().hex[:8]}"
    code = tmp_path / "code"
    (code / "evilpkg" / "evilmod").mkdir(parents=True)
    (code / "evilpkg" / "evilmod" / "__init__.py").write_text("EVIL = 1\n")
    (code / "evilpkg" / "setup.py").write_text(SETUP.format(marker=str(marker)))
    settings = Settings().with_(bridge_name=BRIDGE, bridge_subnet=SUBNET, home=str(tmp_path / "home"),
                        image_cache=str(IMAGE_CACHE))
    runtime = RuncRuntime(tmp_path / "state", settings)
    sandboxes = Sandboxes(settings, tmp_path / "state")
    stop = asyncio.Event()
    serving = asyncio.create_task(sandboxes.egress.serve(stop))
    cache = sandboxes.packages_dir(f"t{uuid.uuid4().hex[:10]}", None)
    try:
        await runtime.prepare()
        proxy = await sandboxes.egress.ready()
        sandbox = ContainerSpec(container_id=f"inst-{uuid.uuid4().hex[:8]}", code_dir=code,
                                sdk_dir=Path(levers9.__file__).resolve().parent.parent, env={}, cpu_millicores=1000,
                                memory_mib=256, packages_dir=cache)
        requirements = ["l9evil @ file:///app/evilpkg", "humanize==4.9.0"]
        ended, tail = await run_job(runtime, install_spec(sandbox, requirements, proxy, sandboxes.pip), 600)
        assert ended.code == 0, tail
        installed = cache / packages.packages_key(requirements, (3, 11))
        assert (installed / packages.MARKER).exists() and (installed / "humanize").is_dir(), tail
        record = json.loads((cache / "record.json").read_text())
        assert record["hostname"] != socket.gethostname() and record["hostname"].endswith("-install")
        assert not marker.exists(), "setup.py wrote on the host"
        assert runtime.running() == []  # the install container is gone
    finally:
        stop.set()
        await serving
        shutil.rmtree(cache.parent, ignore_errors=True)
        shutil.rmtree(marker, ignore_errors=True)
        await firewall.remove(BRIDGE)
        await network.ip("link", "del", BRIDGE, check=False)
