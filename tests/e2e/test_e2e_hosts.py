"""Workers on other hosts, for real on one machine: a stack whose pool `default` has the backend `netns`
(two workers, each its own network namespace and address on the underlay, levers9.runtime.hosts).

An endpoint call reaches a container through its worker's host address (never its bridge); a function
call goes through the host's executor relay; a checkpoint dumped on one host is restored on the other,
its node cache filled from the first host's; a host whose link is cut is declared lost and its
container runs again on the other host within 15 s; the hosts' bridge subnets differ; from inside a
host only the published control-plane ports of the machine answer, and a container reaches neither
the control plane nor the other host. `levers9 down` removes the hosts and the underlay.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from _e2e import api, cli, needs_runc, wait_until

pytestmark = pytest.mark.slow
APPS = Path(__file__).parent / "apps"
UNDERLAY = ipaddress.IPv4Network("10.210.0.0/24")
needs_runc()

HOSTS_APP = '''
import socket
from levers9 import App

app = App("hostsapp")


@app.endpoint(cpu=0.25, memory="128Mi", keep_warm_seconds=600, timeout=60)
def hostsapp(targets: str = ""):
    seen = {}
    for target in filter(None, targets.split(",")):
        host, port = target.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            seen[target] = "open"
        except OSError as exc:
            seen[target] = type(exc).__name__
    return {"seen": seen}
'''


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("l9hosts")
    pools = home / "pools.toml"
    pools.write_text('[pools.default]\nbackend = "netns"\nmin_warm = 2\nmax_workers = 2\nidle_timeout_s = 600\n'
                     'worker_cpu_millicores = 2000\nworker_memory_mib = 2048\n')
    e = {k: v for k, v in os.environ.items() if not k.startswith("LEVERS9_")}
    # `levers9 up`'s own worker (local-1, on the machine) in a pool no request names: only hosts take work
    e.update(LEVERS9_HOME=str(home), LEVERS9_POOLS_FILE=str(pools), LEVERS9_WORKER_POOL="machine")
    try:
        cli(e, "up")
        wait_until(lambda: len(hosts(e)) >= 2, timeout=600)
        app = home / "hostsapp.py"
        app.write_text(HOSTS_APP)
        cli(e, "deploy", str(app))
        cli(e, "deploy", str(APPS / "stateful.py"))
        cli(e, "deploy", str(APPS / "fn_stats.py"))
        yield e
    finally:
        for n in range(1, 4):  # a cut link back up, so its worker stops its containers at `down`
            subprocess.run(["ip", "link", "set", f"l9u{n}", "up"], capture_output=True)
        cli(e, "down", check=False)
    assert not [p for p in os.listdir("/run/netns") if p.startswith("l9h-")], "down left host namespaces"
    assert not Path("/sys/class/net/levers9hosts").exists(), "down left the underlay bridge"


def cache_port(env) -> int:
    """The node cache port of this home's workers (`levers9 up` gives each home its own)."""
    from levers9.runtime.config import Settings

    return Settings.load(env={"LEVERS9_HOME": env["LEVERS9_HOME"]}).images.cache_port


def hosts(env) -> dict[str, dict]:
    """Ready pool workers (with runc and CRIU) -> the worker row, with `host` (its address) and `netns`."""
    out = {}
    for w in api(env, "GET", "/api/v1/workers").json():
        if w["pool"] == "default" and w["status"] == "ready" and "criu" in w["features"]:
            host = urlsplit(w["address"]).hostname
            out[w["worker_id"]] = {**w, "host": host, "n": int(ipaddress.IPv4Address(host)) - int(UNDERLAY[1])}
    return out


def container(env, cid: str) -> dict:
    return api(env, "GET", f"/api/v1/containers/{cid}").json()


def in_host(n: int, code: str) -> str:
    proc = subprocess.run(["nsenter", f"--net=/run/netns/l9h-{n}", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


CONNECT = ("import socket, sys\nfor t in sys.argv[1:] or {targets!r}:\n"
           "    h, p = t.rsplit(':', 1)\n    try:\n        socket.create_connection((h, int(p)), timeout=1).close()\n"
           "        print(t, 'open')\n    except OSError as e:\n        print(t, type(e).__name__)\n")


def reach(n: int, targets: list[str]) -> dict[str, str]:
    out = in_host(n, CONNECT.format(targets=targets))
    return dict(line.split(" ", 1) for line in out.splitlines())


def state(env) -> dict:
    return json.loads((Path(env["LEVERS9_HOME"]) / "state.json").read_text())


def test_each_worker_is_its_own_host_with_its_own_bridge(env):
    hs = hosts(env)  # two, or three when the pool controller over-provisioned at start (seen once)
    assert len({h["host"] for h in hs.values()}) == len(hs) >= 2
    assert all(ipaddress.IPv4Address(h["host"]) in UNDERLAY for h in hs.values())
    subnets = []
    for h in hs.values():
        out = json.loads(subprocess.run(["ip", "-n", f"l9h-{h['n']}", "-j", "-4", "addr", "show", "dev",
                                         f"l9hbr{h['n']}"], capture_output=True, text=True, check=True).stdout)
        info = out[0]["addr_info"][0]
        subnets.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    assert all(not x.overlaps(y) for i, x in enumerate(subnets) for y in subnets[i + 1:])
    assert not any(s.overlaps(ipaddress.IPv4Network("10.209.0.0/24")) for s in subnets)


def test_from_a_host_only_the_published_control_plane_answers(env):
    st = state(env)["components"]
    n = next(iter(hosts(env).values()))["n"]
    nats, gateway, pool_ctl = st["nats"]["port"], st["gateway"]["port"], st["pool-controller"]["port"]
    seen = reach(n, [f"10.210.0.1:{nats}", f"10.210.0.1:{gateway}", f"10.210.0.1:{pool_ctl}",
                     f"10.210.0.1:{st['nats']['monitor_port']}", f"127.0.0.1:{gateway}"])
    assert seen[f"10.210.0.1:{nats}"] == "open" and seen[f"10.210.0.1:{gateway}"] == "open"
    # a loopback-only service of the machine that the workers do not need, and the machine's loopback
    assert seen[f"10.210.0.1:{pool_ctl}"] != "open" and seen[f"10.210.0.1:{st['nats']['monitor_port']}"] != "open"
    assert seen[f"127.0.0.1:{gateway}"] != "open"


def test_an_endpoint_call_reaches_its_container_through_its_host(env):
    hs = hosts(env)
    nats = state(env)["components"]["nats"]["port"]
    others = [f"{h['host']}:{cache_port(env)}" for h in hs.values()]
    r = api(env, "POST", "/endpoint/hostsapp", json={"targets": ",".join([f"10.210.0.1:{nats}", *others])})
    assert r.status_code == 200, r.text
    c = container(env, r.headers["x-levers9-container-id"])
    addr = urlsplit(c["address"])
    assert addr.hostname == hs[c["worker_id"]]["host"] and addr.port >= 20000  # the host's port, not the bridge
    # the container reaches neither the control plane nor any host (its own included)
    assert all(v != "open" for v in r.json()["seen"].values()), r.json()


def test_a_function_call_runs_in_a_sandbox_on_a_host(env):
    code = "from levers9 import Function\nprint(Function.lookup('stats', 'zscore').remote([2, 4]))\n"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "[-1.0, 1.0]" in proc.stdout, proc.stdout + proc.stderr
    # the gateway reached the sandbox through the executor relay of its worker's host
    relays = [urlsplit(c["address"]).hostname for c in api(env, "GET", "/api/v1/containers", params={"all": "true"}).json()
              if c["address"].startswith("exec://")]
    assert relays and all(ipaddress.IPv4Address(h) in UNDERLAY for h in relays), relays


def stateful(env) -> dict:
    r = api(env, "POST", "/endpoint/stateful", json={})
    assert r.status_code == 200, r.text
    return {**r.json(), "container_id": r.headers["x-levers9-container-id"]}


def test_a_checkpoint_dumped_on_one_host_restores_on_the_other_filled_from_its_cache(env):
    first = stateful(env)
    a = container(env, first["container_id"])["worker_id"]
    ck = wait_until(lambda: [c for c in api(env, "GET", "/api/v1/checkpoints", params={"all": "true"}).json()
                             if c["deployment_id"].startswith("stateful-") and c["status"] == "available"],
                    timeout=120)[0]
    wait_until(lambda: container(env, first["container_id"])["status"] in ("stopped", "failed"), timeout=60)
    hs = hosts(env)
    assert api(env, "POST", f"/api/v1/workers/{a}/cordon").status_code < 300
    try:
        second = stateful(env)
    finally:
        api(env, "POST", f"/api/v1/workers/{a}/uncordon")
    restored = container(env, second["container_id"])
    b = restored["worker_id"]
    assert b != a and b in hs and restored["restored_from"] == ck["checkpoint_id"]
    assert second["value"] == first["value"]  # the state built on host A, served from host B
    stats = httpx.get(f"http://{hs[b]['host']}:{cache_port(env)}/stats", timeout=5).json()
    assert stats["fills_peer"] >= 1, stats  # from A's node cache, over the underlay


def test_a_cut_off_hosts_container_runs_again_on_the_other_host(env):
    r = api(env, "POST", "/endpoint/hostsapp", json={})
    assert r.status_code == 200, r.text
    before = container(env, r.headers["x-levers9-container-id"])
    hs = hosts(env)
    a = hs[before["worker_id"]]
    subprocess.run(["ip", "link", "set", f"l9u{a['n']}", "down"], check=True)

    def served_elsewhere():
        try:
            r = api(env, "POST", "/endpoint/hostsapp", json={}, timeout=4)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        c = container(env, r.headers["x-levers9-container-id"])
        return c if c["worker_id"] != a["worker_id"] else None

    # how soon (about 15 s idle: heartbeat TTL, fence, placement) is for bench/, not a test
    again = wait_until(served_elsewhere, timeout=120, every=0.3)
    assert urlsplit(again["address"]).hostname != a["host"]
    lost = [w for w in api(env, "GET", "/api/v1/workers").json() if w["worker_id"] == a["worker_id"]]
    assert lost and lost[0]["status"] == "lost"
