"""The worker acting on delivered events, without servers: a placement starts a container from the
ContainerScheduled alone (spec, resources, checkpoint), a bare one fails with its reason, stale ones
are skipped, and the code fetch names the placement's stream sequence. The bus, the runtime and the
gateway are fakes; nothing here reads a projection."""

from __future__ import annotations

import asyncio
import base64
import io
import tarfile
from pathlib import Path

import httpx
import msgspec
import pytest

from levers9.contracts import envelope
from levers9.contracts import events as E
from levers9.contracts.envelope import Message, decode, encode
from levers9.contracts.spec import CheckpointRef, Code, DeploymentSpec, Resources
from levers9.runtime import sealing
from levers9.runtime.config import Settings
from levers9.runtime.consumer import Delivery
from levers9.worker.checkpoints import orchestration as checkpointing
from levers9.worker.lifecycle import containers as worker_containers
from levers9.worker.lifecycle.containers import NOTHING_TO_RUN
from levers9.worker.runtime.interface import ContainerSpec, Exit, Runtime, Started
from levers9.worker.service import WorkerService

SPEC = DeploymentSpec(name="hello", code=Code(module="app", handler="handler", sha256="ab" * 32, key="code/x"),
                      env={"GREETING": "hi"}, timeout_seconds=30)


class FakeBus:
    def __init__(self) -> None:
        self.published: list[E.Event] = []

    async def publish(self, env) -> None:
        self.published.append(env)


class FakeRuntime:
    """Starts nothing: records what it was asked, and every container has exited at once."""
    name = "fake"
    features: list[str] = []
    checkpoint_ready = False

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[ContainerSpec] = []
        self.restored: list[tuple[ContainerSpec, Path]] = []
        self.stopped: list[str] = []

    async def start(self, spec: ContainerSpec) -> Started:
        self.started.append(spec)
        return Started(address="http://127.0.0.1:9", pid=1, log_path=self.tmp / "log")

    async def restore(self, spec: ContainerSpec, tar: Path) -> Started:
        self.restored.append((spec, tar))
        return Started(address="http://127.0.0.1:9", pid=1, log_path=self.tmp / "log")

    async def poll(self, container_id: str) -> Exit | None:
        return Exit(1, "exited with status 1")

    async def stop(self, container_id: str, timeout: float = 10) -> Exit:
        self.stopped.append(container_id)
        return Exit(1, "exited with status 1")

    def log_path(self, container_id: str) -> Path:
        return self.tmp / f"{container_id}.log"

    def open_log(self, container_id: str):
        return open(self.log_path(container_id), "rb")

    log_tail = Runtime.log_tail


RING = sealing.dump_keyring(sealing.rotated(None))


@pytest.fixture
def worker(tmp_path) -> WorkerService:
    # a worker of the platform's machine: it holds the secrets keyring (it opens sealed checkpoints)
    w = WorkerService(Settings().with_(home=str(tmp_path), worker_id="w1", image_cache=str(tmp_path / "cache"),
                               gateway_url="http://gateway.test", worker_token="t0k", secret_key=RING))
    w.bus = FakeBus()
    w.runtime = FakeRuntime(tmp_path)
    w.ready.set()
    return w


def delivery(event: E.Event, seq: int) -> Delivery:
    env = envelope(event, workspace="acme", correlation_id="corr-1")
    return Delivery(seq=seq, subject=env.subject, data=b"", headers={}, num_delivered=1,
                    message=Message(envelope=env, event=event, subject=env.subject))


def scheduled(cid: str = "c1", worker_id: str = "w1", **kw) -> E.ContainerScheduled:
    values = dict(container_id=cid, worker_id=worker_id, deployment_id="hello-1", deployment_version=1,
                  resources=Resources(cpu_millicores=250, memory_mib=128), spec=SPEC)
    values.update(kw)
    return E.ContainerScheduled(**values)


def published(w: WorkerService, kind: type) -> list:
    return [m.event for m in (decode(encode(e)) for e in w.bus.published) if isinstance(m.event, kind)]


async def settle(w: WorkerService) -> None:
    for c in list(w.containers.values()):
        if c.task is not None:
            await c.task


def fake_gateway(monkeypatch, key_reply: dict | None = None) -> list[httpx.Request]:
    """The gateway's code route, answering with a tiny archive, and its checkpoint-key route answering
    key_reply["status"] with key_reply["body"]; records what it was asked."""
    asked: list[httpx.Request] = []
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        info = tarfile.TarInfo("app.py")
        body = b"def handler(ctx): return 'hi'\n"
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        if key_reply is not None and request.url.path.endswith("/checkpoint-key"):
            return httpx.Response(key_reply["status"], json=key_reply["body"])
        return httpx.Response(200, content=archive.getvalue())

    real = httpx.AsyncClient
    monkeypatch.setattr(worker_containers.httpx, "AsyncClient",
                        lambda **kw: real(**{**kw, "transport": httpx.MockTransport(answer)}))
    return asked


@pytest.fixture
def gateway(monkeypatch):
    return fake_gateway(monkeypatch)


def restores_into(monkeypatch, seen: list, what=lambda checkpoint, data_key: checkpoint) -> None:
    """checkpointing.restore restores at once, recording `what` of each call."""
    async def restore(runtime, cspec, checkpoint, cache_url, data_key=None):
        seen.append(what(checkpoint, data_key))
        return await runtime.restore(cspec, Path("/blob"))

    monkeypatch.setattr(checkpointing, "restore", restore)


async def test_a_placement_starts_from_the_event_alone(worker, gateway):
    await worker.on_container_event(delivery(scheduled(), seq=42))
    await settle(worker)
    [spec] = worker.runtime.started
    assert (spec.container_id, spec.cpu_millicores, spec.memory_mib) == ("c1", 250, 128)
    assert spec.env["GREETING"] == "hi" and spec.env["LEVERS9_RUNNER_MODULE"] == "app"
    assert spec.env["LEVERS9_RUNNER_TIMEOUT"] == "30" and spec.env["LEVERS9_DEPLOYMENT_ID"] == "hello-1"
    assert (spec.code_dir / "app.py").exists()
    [request] = gateway
    assert request.url.path == "/api/v1/internal/deployments/hello-1/code"
    assert dict(request.url.params) == {"workspace": "acme", "container_id": "c1", "seq": "42"}
    assert request.headers["authorization"] == "Bearer t0k"
    [started] = published(worker, E.ContainerStarted)
    assert started.container_id == "c1" and started.restored_from == ""
    [failed] = published(worker, E.ContainerFailed)  # the fake runtime's container exits at once
    assert failed.reason.startswith("exited with status 1")
    assert all(e.correlation_id == "corr-1" for e in worker.bus.published)


async def test_a_bare_request_fails_with_its_reason(worker):
    await worker.on_container_event(delivery(scheduled(deployment_id="", spec=None), seq=5))
    [failed] = published(worker, E.ContainerFailed)
    assert failed.reason == NOTHING_TO_RUN and failed.worker_id == "w1"
    assert worker.runtime.started == [] and worker.containers == {}


async def test_a_redelivered_placement_does_not_start_twice(worker, gateway):
    for _ in range(2):
        await worker.on_container_event(delivery(scheduled(), seq=42))
        await settle(worker)
    assert len(worker.runtime.started) == 1


async def test_a_placement_overtaken_by_later_events_is_skipped(worker, gateway):
    await worker.on_container_event(delivery(E.ContainerStopRequested(container_id="c1"), seq=50))
    await worker.on_container_event(delivery(scheduled("c2", worker_id="w2"), seq=51))
    # placements of c1 and c2 on this worker delivered late (a nak'd message coming back)
    await worker.on_container_event(delivery(scheduled("c1"), seq=42))
    await worker.on_container_event(delivery(scheduled("c2"), seq=43))
    await settle(worker)
    assert worker.runtime.started == []
    await worker.on_container_event(delivery(scheduled("c1"), seq=60))  # placed again afterwards: new
    await settle(worker)
    assert [s.container_id for s in worker.runtime.started] == ["c1"]


async def test_placements_of_other_workers_are_not_ours(worker, gateway):
    await worker.on_container_event(delivery(scheduled(worker_id="w2"), seq=7))
    assert worker.runtime.started == [] and worker.bus.published == []


async def test_a_placement_with_a_checkpoint_restores_it(worker, gateway, monkeypatch):
    ref = CheckpointRef(checkpoint_id="ck1", sha256="cd" * 32, bucket="levers9-acme", key="checkpoints/ck1.tar")
    asked: list = []
    restores_into(monkeypatch, asked)
    await worker.on_container_event(delivery(scheduled(checkpoint=ref), seq=9))
    await settle(worker)
    assert asked == [ref] and worker.runtime.started == []
    [started] = published(worker, E.ContainerStarted)
    assert started.restored_from == "ck1" and started.note == "restored from ck1"


async def test_a_failed_restore_is_marked_and_starts_cold(worker, gateway, monkeypatch):
    ref = CheckpointRef(checkpoint_id="ck1", sha256="cd" * 32, bucket="b", key="k")

    async def restore(runtime, cspec, checkpoint, cache_url, data_key=None):
        raise checkpointing.RestoreError("the node cache could not get the checkpoint: refused")

    monkeypatch.setattr(checkpointing, "restore", restore)
    await worker.on_container_event(delivery(scheduled(checkpoint=ref), seq=9))
    await settle(worker)
    [failed] = published(worker, E.CheckpointFailed)
    assert (failed.checkpoint_id, failed.stage) == ("ck1", "restore") and "refused" in failed.reason
    [started] = published(worker, E.ContainerStarted)
    assert started.restored_from == "" and started.note.startswith("cold: restore of ck1 failed")
    assert len(worker.runtime.started) == 1


def keyless_gateway(monkeypatch, worker, reply: dict) -> list[httpx.Request]:
    """A worker without the keyring (a Kubernetes pool's, an attached cluster's) and the fake gateway."""
    worker.settings = worker.settings.with_(secret_key="")
    return fake_gateway(monkeypatch, reply)


async def test_a_worker_without_the_keyring_restores_with_the_key_the_gateway_gives_for_that_checkpoint(
        worker, monkeypatch):
    ref = CheckpointRef(checkpoint_id="ck1", sha256="cd" * 32, bucket="b", key="k")
    key = bytes(range(32))
    asked = keyless_gateway(monkeypatch, worker, {"status": 200, "body": {"data_key": base64.b64encode(key).decode()}})
    keys: list = []
    restores_into(monkeypatch, keys, lambda checkpoint, data_key: data_key)
    await worker.on_container_event(delivery(scheduled(checkpoint=ref), seq=9))
    await settle(worker)
    assert keys == [key]
    [started] = published(worker, E.ContainerStarted)
    assert started.restored_from == "ck1"
    [request] = [r for r in asked if r.url.path.endswith("/checkpoint-key")]
    assert request.url.path == "/api/v1/internal/deployments/hello-1/checkpoint-key"
    assert dict(request.url.params) == {"workspace": "acme", "container_id": "c1", "seq": "9", "checkpoint_id": "ck1"}
    assert request.headers["authorization"] == "Bearer t0k"


async def test_a_worker_without_the_keyring_starts_cold_and_blames_no_checkpoint_when_no_key_comes(
        worker, monkeypatch):
    """The gateway refuses (or gives something that is no AES-256 key): the worker starts cold, says
    why, and leaves the checkpoint usable by the workers that can open it."""
    ref = CheckpointRef(checkpoint_id="ck1", sha256="cd" * 32, bucket="b", key="k")

    async def restore(runtime, cspec, checkpoint, cache_url, data_key=None):
        raise AssertionError("tried to restore without a key")

    monkeypatch.setattr(checkpointing, "restore", restore)
    reply: dict = {}
    keyless_gateway(monkeypatch, worker, reply)
    for status, body, why in ((404, {"detail": "no stored checkpoint ck1"}, "(404)"),
                              (200, {"data_key": base64.b64encode(b"short").decode()}, "5-byte key")):
        reply.update(status=status, body=body)
        await worker.on_container_event(delivery(scheduled(cid=f"c{status}", checkpoint=ref), seq=9))
        await settle(worker)
        started = published(worker, E.ContainerStarted)[-1]
        assert started.restored_from == "" and "holds no keyring" in started.note and why in started.note
    assert published(worker, E.CheckpointFailed) == []
    assert len(worker.runtime.started) == 2


async def test_a_worker_without_the_keyring_needs_no_key_for_a_checkpoint_its_node_holds(worker, monkeypatch):
    ref = CheckpointRef(checkpoint_id="ck1", sha256="cd" * 32, bucket="b", key="k")
    asked = keyless_gateway(monkeypatch, worker, {"status": 500, "body": {"detail": "not asked"}})
    worker.cache.root.mkdir(parents=True, exist_ok=True)
    (worker.cache.root / ref.sha256).write_bytes(b"a dump this node made or filled")
    keys: list = []
    restores_into(monkeypatch, keys, lambda checkpoint, data_key: data_key)
    await worker.on_container_event(delivery(scheduled(checkpoint=ref), seq=9))
    await settle(worker)
    assert keys == [None] and published(worker, E.ContainerStarted)[0].restored_from == "ck1"
    assert not [r for r in asked if r.url.path.endswith("/checkpoint-key")]


# ---- dumps: the policy decides, the claim makes it one per version, every outcome is an event --------

class FakePool:
    """worker.deployments / worker.checkpoints as the claim reads them."""

    def __init__(self, has_checkpoint: bool = False) -> None:
        self.has_checkpoint = has_checkpoint

    async def fetchrow(self, query: str, *args):
        return {"last_seq": 3, "checkpoint_claim": ""}

    async def fetchval(self, query: str, *args):
        return 1 if self.has_checkpoint else 0


class Appending(FakeBus):
    def __init__(self) -> None:
        super().__init__()
        self.appended: list[tuple] = []

    async def append(self, env, expected_last_seq: int):
        self.appended.append((env, expected_last_seq))


ENABLED = msgspec.structs.replace(SPEC, checkpoint_enabled=True)


def ready_container(worker: WorkerService, spec: DeploymentSpec = SPEC, restored_from: str = ""):
    from levers9.worker.lifecycle.placement import Running
    c = Running("c1", "acme", "hello-1", "corr-1", 0.0, spec=spec, deployment_version=1, memory_mib=128,
                restored_from=restored_from)
    c.ready_at = 1.0
    return c


async def dump_fails(container_id: str, out_tar: Path, *, cut_connections: bool = False):
    raise checkpointing.CheckpointError("CRIU could not dump c1: no")


async def test_a_first_cold_start_is_claimed_and_dumped(worker, monkeypatch):
    worker.bus, worker.pool = Appending(), FakePool()
    worker.runtime.checkpoint_ready = True
    worker.runtime.memory_usage = lambda cid: None
    worker.runtime.checkpoint = dump_fails
    await worker.checkpoints.checkpoint(ready_container(worker, ENABLED))
    [(claim, expected)] = worker.bus.appended
    assert expected == 3 and decode(encode(claim)).event.container_id == "c1"
    [failed] = published(worker, E.CheckpointFailed)
    assert failed.stage == "dump" and "no" in failed.reason
    assert failed.checkpoint_id == decode(encode(claim)).event.checkpoint_id
    assert worker.checkpoints.dumping == set()


@pytest.mark.parametrize("why, spec, restored, has_one, ready", [
    ("checkpoint_enabled is off", SPEC, "", False, True),
    ("restored from a checkpoint already", ENABLED, "ck0", False, True),
    ("this deployment version has a checkpoint", ENABLED, "", True, True),
    ("CRIU is not ready on this worker", ENABLED, "", False, False),
])
async def test_the_policy_says_no(worker, caplog, why, spec, restored, has_one, ready):
    worker.bus, worker.pool = Appending(), FakePool(has_checkpoint=has_one)
    worker.runtime.checkpoint_ready = ready
    with caplog.at_level("INFO", logger="levers9.worker.checkpoints.orchestration"):
        await worker.checkpoints.checkpoint(ready_container(worker, spec, restored))
    assert worker.bus.appended == [] and worker.bus.published == []  # no claim, no event: nobody asked
    assert f"no checkpoint of c1: {why}" in caplog.messages


async def test_a_manual_dump_the_policy_refuses_says_why(worker):
    worker.bus, worker.pool = Appending(), FakePool()
    worker.runtime.checkpoint_ready = False
    await worker.checkpoints.checkpoint(ready_container(worker), manual=True)
    [failed] = published(worker, E.CheckpointFailed)
    assert failed.reason == "CRIU is not ready on this worker" and worker.bus.appended == []


class SlowStopRuntime(FakeRuntime):
    """Its containers run until stopped, and a stop takes until the test lets it end."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.let_stop = asyncio.Event()
        self.stopping: list[str] = []

    async def poll(self, container_id: str) -> Exit | None:
        return None if container_id == "c0" else Exit(1, "exited with status 1")

    async def stop(self, container_id: str, timeout: float = 10) -> Exit:
        # only c0's stop is slow: c1 (which exits at once) is cleaned up when its start sees it exit,
        # and that stop waiting for the test's signal hung the test whenever the exit was seen first
        self.stopping.append(container_id)
        if container_id == "c0":
            await self.let_stop.wait()
        return await super().stop(container_id, timeout)


async def test_a_stop_under_way_does_not_hold_up_the_next_placement(worker, gateway, tmp_path):
    from levers9.worker.lifecycle.placement import Running

    worker.runtime = SlowStopRuntime(tmp_path)
    running = Running("c0", "acme", "hello-1", "corr-0", 0.0, spec=SPEC, ready_at=1.0)
    worker.containers._live["c0"] = running
    await asyncio.wait_for(worker.on_container_event(delivery(E.ContainerStopRequested(container_id="c0"), 40)), 5)
    await asyncio.wait_for(worker.on_container_event(delivery(scheduled("c1"), seq=41)), 5)  # not behind the stop
    await settle(worker)
    assert [s.container_id for s in worker.runtime.started] == ["c1"]
    assert "c0" in worker.runtime.stopping  # under way, not ended
    assert not [e for e in published(worker, E.ContainerStopped) if e.container_id == "c0"]
    worker.runtime.let_stop.set()
    await asyncio.wait_for(worker.containers.stop_all("worker stopping"), 5)  # waits for the stop under way
    assert [e.container_id for e in published(worker, E.ContainerStopped) if e.container_id == "c0"] == ["c0"]
    assert "c0" not in worker.containers
