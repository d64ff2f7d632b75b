"""Real builds with buildah on this machine, pushed to the session's registry (the `servers` fixture):
the builder is run directly (no pool controller, no image-builder), with an ImageBuildStarted made
from the blueprint's steps as the image-builder would make it.

- a blueprint with a PyPI package not in the base, a command writing a file and an env variable is
  pushed; skopeo copies it out of the registry, and its layers hold the file and the package, its
  config the variable;
- the same blueprint with only its last command changed reuses every earlier step (reported cached)
  and runs only the last;
- an unknown package fails the build at its step, with pip's own message in the log tail; this one
  goes through the build consumer on the real NATS (a start for another builder is left alone);
- a step is confined: in its own network namespace on a bridge of the test's own, it reaches none of
  the servers' ports nor any host address, and reaches the package index through the egress proxy.

Steps run in namespaces on the test's bridge (BRIDGE), through an egress proxy served for the test
(levers9.worker.network.egress_proxy.Egress), as on a build worker.

The platform base is pushed to the registry once per registry, i.e. once per test session here.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from levers9.contracts import decode, envelope, subjects, uuid7
from levers9.contracts import events as E
from levers9.contracts.images import build_steps, cached_prefix, image_id, image_tag
from levers9.contracts.spec import ImageSpec
from levers9.runtime.bus import Bus
from levers9.runtime.config import Settings
from levers9.worker.builds.builder import BuildHost, Builds, run_build
from levers9.worker.network import bridge as network
from levers9.worker.network import firewall
from levers9.worker.network.egress_proxy import Egress
from levers9.worker.runtime.runc.rootfs import base_rootfs_path

IMAGE_CACHE = Path(os.environ.get("LEVERS9_IMAGE_CACHE") or "/var/cache/levers9")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="buildah runs steps as root here"),
    pytest.mark.skipif(not (shutil.which("buildah") and shutil.which("skopeo")), reason="buildah/skopeo missing"),
]

TIMES: dict[str, float] = {}
BRIDGE, SUBNET = "l9bldt0", "10.219.9.0/28"


@pytest.fixture
async def lanes(servers, tmp_path):
    """The build worker's egress proxy and step namespaces, on the test's bridge."""
    settings = Settings().with_(bridge_name=BRIDGE, bridge_subnet=SUBNET, nats_url=servers.get("nats_url", ""),
                        registry=servers.get("registry", ""))
    egress = Egress(settings, tmp_path)
    stop = asyncio.Event()
    task = asyncio.create_task(egress.serve(stop))
    try:
        await egress.ready(60)
        yield egress
    finally:
        stop.set()
        await task
        await firewall.remove(BRIDGE)
        await network.ip("link", "del", BRIDGE, check=False)


def started_event(spec: ImageSpec, builder: str, cached_hashes: set[str] = frozenset()) -> E.ImageBuildStarted:
    steps = build_steps(spec)
    return E.ImageBuildStarted(image_id=image_id(spec), builder=builder, blueprint=spec, steps=steps,
                               cached_steps=cached_prefix(steps, set(cached_hashes)))


async def build(registry: str, started: E.ImageBuildStarted, lanes: Egress) -> tuple[E.Event, list[E.Event], float]:
    events: list[E.Event] = []

    async def emit(event: E.Event) -> None:
        envelope(event, workspace="t")  # every event must make a valid envelope
        events.append(event)

    host = BuildHost(registry=registry, image_cache=IMAGE_CACHE, builder=started.builder, emit=emit, lanes=lanes)
    began = time.monotonic()
    result = await run_build(started, host)
    return result, events, time.monotonic() - began


def pull_layout(registry: str, reference: str, into: Path) -> tuple[dict, list[Path]]:
    """skopeo copy of the image out of the registry; (its config, its layer blobs in order)."""
    subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{registry}/{reference}",
                    f"oci:{into}:x"], check=True, timeout=120)
    index = json.loads((into / "index.json").read_text())
    blob = lambda digest: into / "blobs" / "sha256" / digest.split(":", 1)[1]  # noqa: E731
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    config = json.loads(blob(manifest["config"]["digest"]).read_text())
    return config, [blob(layer["digest"]) for layer in manifest["layers"]]


def layer_names(layer: Path) -> set[str]:
    with tarfile.open(layer) as tar:
        return {name.lstrip("./") for name in tar.getnames()}


@pytest.fixture(scope="module")
def registry(servers):
    if not servers.get("registry"):
        pytest.skip("the servers fixture has no registry")
    if not base_rootfs_path(IMAGE_CACHE).is_dir():
        pytest.skip(f"no base root fs at {base_rootfs_path(IMAGE_CACHE)} (a worker makes it: minutes, once)")
    return servers["registry"]


def blueprint(ws: str, last: str) -> ImageSpec:
    # the marker makes the blueprint new to this run (the layer cache lives on in buildah's storage)
    return ImageSpec(python_packages=["humanize"], commands=[f"echo {ws} > /opt/levers9-made.txt", last],
                     env={"X": "1"})


async def test_a_blueprint_is_built_pushed_and_rebuilt_from_its_changed_step(registry, lanes, tmp_path):
    ws = "t" + uuid7().replace("-", "")[-12:]
    first = started_event(blueprint(ws, "echo first"), "builder-test")
    pushed, events, took = await build(registry, first, lanes)
    assert isinstance(pushed, E.ImagePushed), pushed
    TIMES["first build (with the base push when the registry lacks it)"] = took
    assert pushed.registry == registry and pushed.reference == image_tag(first.image_id)
    assert pushed.digest.startswith("sha256:") and pushed.step_hashes == [s.hash for s in first.steps]
    running = [e.step for e in events if isinstance(e, E.ImageBuildProgress) and e.state == "running"]
    assert running == [0, 1, 2, 3]
    logs = [line for e in events if isinstance(e, E.ImageBuildProgress) and e.state == "log" for line in e.lines]
    assert any("humanize" in line for line in logs)  # pip's own output is streamed

    config, layers = pull_layout(registry, pushed.reference, tmp_path / "first")
    assert "X=1" in config["config"]["Env"]
    assert len(layers) >= 4  # the base, then one layer per step (and the config-only commit)
    names = set().union(*(layer_names(layer) for layer in layers[1:]))
    assert "opt/levers9-made.txt" in names
    assert any(n.endswith("site-packages/humanize/__init__.py") or n.endswith("dist-packages/humanize/__init__.py")
               for n in names), sorted(n for n in names if "humanize" in n)[:5]
    assert not any(n.startswith(("opt/wheels", "etc/pip.conf", "root/.config/pip")) for n in names), \
        "the pip config mount points must not land in a layer"

    second = started_event(blueprint(ws, "echo second"), "builder-test", set(pushed.step_hashes))
    assert second.cached_steps == 3
    again, events, took = await build(registry, second, lanes)
    TIMES["rebuild after changing the last command"] = took
    assert isinstance(again, E.ImagePushed), again
    states = [(e.step, e.state) for e in events if isinstance(e, E.ImageBuildProgress)
              and e.state in ("cached", "running")]
    assert states == [(0, "cached"), (1, "cached"), (2, "cached"), (3, "running")]
    cached_lines = [e.lines[0] for e in events if isinstance(e, E.ImageBuildProgress) and e.state == "cached"]
    assert cached_lines[1].startswith(f"step 2/4 cached (layer {first.steps[1].hash[:12]})")
    config, layers = pull_layout(registry, again.reference, tmp_path / "second")
    assert "X=1" in config["config"]["Env"] and again.digest != pushed.digest
    print("\n" + "\n".join(f"{what}: {seconds:.1f} s" for what, seconds in TIMES.items()))


async def test_an_unknown_package_fails_with_pips_message_through_the_build_consumer(registry, servers, lanes):
    ws = "t" + uuid7().replace("-", "")[-12:]
    me = f"builder-{ws}"
    bus = await Bus.connect(servers["nats_url"])
    await bus.ensure_topology()
    builds = Builds(me, registry, IMAGE_CACHE, publish=bus.publish, lanes=lanes)
    stop = asyncio.Event()
    consumer = asyncio.create_task(builds.consumer(bus).run(stop))
    try:
        bad = ImageSpec(python_packages=[f"levers9-no-such-package-{ws}"], commands=["echo never"])
        not_mine = started_event(ImageSpec(commands=[f"echo {ws}"]), f"someone-else-{ws}")
        mine = started_event(bad, me)
        for started in (not_mine, mine):
            await bus.publish(envelope(started, workspace=ws))
        failed = await wait_for_event(bus, ws, mine.image_id, "ImageBuildFailed")
    finally:
        stop.set()
        await asyncio.wait_for(consumer, 20)
        await bus.close()
    assert failed.step == 1
    assert failed.reason == f"step 2/3 `RUN pip install levers9-no-such-package-{ws}` exited 1"
    assert any("No matching distribution found" in line for line in failed.log_tail), failed.log_tail
    assert builds.finished == 1 and (not_mine.image_id, 1) not in builds.taken


async def wait_for_event(bus: Bus, ws: str, image: str, type_: str, timeout: float = 120) -> E.Event:
    sub = await bus.js.subscribe(subjects.filter_subject(workspace=ws, aggregate="image", aggregate_id=image),
                                 ordered_consumer=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = await sub.next_msg(timeout=deadline - time.monotonic())
            event = decode(msg.data, msg.subject).event
            if type(event).__name__ == type_:
                return event
        raise AssertionError(f"no {type_} for {image} within {timeout} s")
    finally:
        await sub.unsubscribe()


async def test_a_stopped_build_kills_its_step_removes_its_container_and_says_so(registry, lanes):
    ws = "t" + uuid7().replace("-", "")[-12:]
    marker = f"levers9-sleeps-{ws}"
    started = started_event(ImageSpec(commands=[f"sleep 300; echo {marker}"]), "builder-test", set())
    events: list[E.Event] = []

    async def emit(event: E.Event) -> None:
        events.append(event)

    host = BuildHost(registry=registry, image_cache=IMAGE_CACHE, builder="builder-test", emit=emit, lanes=lanes)
    task = asyncio.create_task(run_build(started, host))
    deadline = time.monotonic() + 60
    while not running_with(marker):  # the step's process runs (after the base is there)
        assert time.monotonic() < deadline and not task.done(), events[-3:]
        await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not running_with(marker), "the step's process outlived its build"
    containers = subprocess.run(["buildah", "containers", "--format", "{{.ContainerName}}"], capture_output=True,
                                text=True, check=True).stdout.split()
    assert f"levers9-build-{started.image_id}" not in containers
    failed = events[-1]
    assert isinstance(failed, E.ImageBuildFailed) and failed.step == 1 and "stopped during the build" in failed.reason


def running_with(marker: str) -> bool:
    """Whether the step's shell runs (inside the container: not `buildah run … -- sh -c …`)."""
    return subprocess.run(["pgrep", "-f", f"^[^ ]*sh -c .*{marker}"], capture_output=True).returncode == 0


PROBE = """import json, os, socket, ssl, sys, urllib.request
from pip._internal.models.index import PyPI
out = {}
for target in json.loads(sys.argv[1]):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        out[target] = "connected"
    except OSError as exc:
        out[target] = type(exc).__name__
context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
try:
    with urllib.request.urlopen(PyPI.simple_url.rstrip("/") + "/pip/", timeout=60, context=context) as answer:
        out["index"] = answer.status
except OSError as exc:
    out["index"] = f"{type(exc).__name__}: {exc}"
print("PROBE " + json.dumps(out), flush=True)
"""


def probe_command(targets: list[str]) -> str:
    import shlex
    return f"python3 -c {shlex.quote(PROBE)} {shlex.quote(json.dumps(targets))}"


async def test_a_step_reaches_no_server_and_no_host_address_but_the_index_through_the_proxy(registry, servers, lanes):
    from urllib.parse import urlsplit
    ports = sorted({urlsplit(u if "://" in u else f"//{u}").port for u in (servers.get("registry", ""),
                    servers.get("nats_url", ""), servers.get("s3_endpoint", ""),
                    servers.get("database_url", ""))} - {None})
    doc = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True).stdout)
    addresses = sorted({a["local"] for link in doc for a in link.get("addr_info", [])} | {"127.0.0.1"})
    proxy_port = int(lanes.address.rsplit(":", 1)[1])
    targets = [f"{a}:{p}" for a in addresses for p in ports] + [f"{a}:{proxy_port}" for a in addresses
                                                               if a != lanes.address.split(":")[0]]
    ws = "t" + uuid7().replace("-", "")[-12:]
    started = started_event(ImageSpec(commands=[f"echo {ws}", probe_command(targets)]), "builder-test")
    result, events, _ = await build(registry, started, lanes)
    assert isinstance(result, E.ImagePushed), result
    lines = [line for e in events if isinstance(e, E.ImageBuildProgress) for line in e.lines]
    report = json.loads(next(line for line in lines if line.startswith("PROBE "))[len("PROBE "):])
    print(json.dumps(report, indent=1))
    assert len(ports) >= 2, servers
    assert [t for t in targets if report[t] == "connected"] == [], report
    assert report["index"] == 200, report  # the package index, through the worker's proxy
