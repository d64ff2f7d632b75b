"""The worker's network addresses (allocation, interface names, claims across processes), the Debian
mirror read from apt sources, and the choice of runtime: no root needed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from levers9.runtime.config import SettingError, Settings
from levers9.worker.images.cache_server import bind_unless_taken
from levers9.worker.network import bridge as network
from levers9.worker.network.bridge import AddressesExhausted, Ipam, Names, bridge_address, next_free_address
from levers9.worker.runtime.choice import choose_runtime, runc_missing
from levers9.worker.runtime.runc import rootfs

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
    rt, note = choose_runtime(Settings().with_(runtime="process"), tmp_path)
    assert rt.name == "process" and rt.features == ["process"] and "no isolation" in note
    with pytest.raises(SettingError, match="use one of auto | runc | process"):
        choose_runtime(Settings().with_(runtime="docker"), tmp_path)
    auto, note = choose_runtime(Settings().with_(runtime="auto"), tmp_path)
    assert auto.name == ("process" if runc_missing() else "runc"), note


# ---- the node cache's port: the first worker of a node serves it, the others share it ------------

def test_bind_unless_taken_says_none_when_another_process_listens():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert bind_unless_taken("127.0.0.1", port) is None
    mine = bind_unless_taken("127.0.0.1", port)  # free again
    assert mine is not None and mine.getsockname() == ("127.0.0.1", port)
    mine.close()
