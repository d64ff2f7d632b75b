"""The image-builder in-process against real NATS, Postgres, S3 and the registry, with a fake
*builder*: a worker of pool `build` (registered through events, like a real one) that answers the
ImageBuildStarted given to it by pushing a small prepared image to the registry (skopeo) and
appending ImagePushed, as a build worker does. The image-builder must give the build to it with the
layer cache's prefix, copy the image out of the registry, unpack it, write archive and index to S3
and append ImageBuilt, whose index decodes to the pushed files."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import shutil
import tarfile
import time
from pathlib import Path

import msgspec
import nats.errors
import pytest

from levers9.contracts import decode, envelope, subjects, uuid7
from levers9.contracts import events as E
from levers9.contracts.image_index import decode_index
from levers9.contracts.images import build_steps, image_id, image_tag
from levers9.contracts.spec import ImageSpec
from levers9.image_builder.service import ImageBuilderService
from levers9.runtime.config import Settings
from levers9.runtime.consumer import Delivery
from levers9.runtime.storage import s3_client

pytestmark = pytest.mark.skipif(shutil.which("skopeo") is None, reason="skopeo is not installed")


class ReplicaForTest(ImageBuilderService):
    """A replica of its own: own schema and durable consumer, starting at the end of the log."""
    deliver_new = True

    def __init__(self, settings: Settings) -> None:
        self.name = f"image-builder-t{uuid7().replace('-', '')[-10:]}"
        super().__init__(settings)


@pytest.fixture
async def builder_service(servers, tmp_path):
    settings = Settings.load(env={"LEVERS9_NATS_URL": servers["nats_url"],
                                  "LEVERS9_DATABASE_URL": servers["database_url"],
                                  "LEVERS9_S3_ENDPOINT": servers["s3_endpoint"],
                                  "LEVERS9_S3_ACCESS_KEY": servers["s3_access_key"],
                                  "LEVERS9_S3_SECRET_KEY": servers["s3_secret_key"],
                                  "LEVERS9_IMAGE_CACHE": str(tmp_path / "cache")})
    svc = ReplicaForTest(settings)
    await svc.connect()
    await svc.on_start()
    loops = [c.run for c in svc.ordered_consumers()] + [c.run for c in svc.reactions()] + svc.background()
    tasks = [asyncio.create_task(fn(svc.stop)) for fn in loops]
    yield svc
    svc.stop.set()
    await asyncio.wait(tasks, timeout=20)
    async with svc.pool.acquire() as conn:
        await conn.execute(f"DROP SCHEMA {svc.schema} CASCADE")
    await svc.bus.close()
    await svc.pool.close()


def oci_layout(root: Path, files: dict[str, bytes]) -> Path:
    """An OCI layout holding one image tagged `img` with one gzip layer of `files`."""
    layout = root / "layout"
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')

    def blob(data: bytes) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (layout / "blobs" / "sha256" / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    gz = io.BytesIO()
    import gzip

    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0) as f:
        f.write(raw.getvalue())
    config = {"architecture": "amd64", "os": "linux",
              "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(raw.getvalue()).hexdigest()}"]},
              "config": {"Env": ["GREETING=hi"]}}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           **blob(json.dumps(config).encode())},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **blob(gz.getvalue())}]}
    index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                                **blob(json.dumps(manifest).encode()),
                                                "annotations": {"org.opencontainers.image.ref.name": "img"}}]}
    (layout / "index.json").write_text(json.dumps(index))
    return layout


async def sh(*cmd: str) -> str:
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()
    return out.decode()


async def fake_builder(svc, ws: str, worker_id: str, registry: str, layout: Path, seen: list) -> None:
    """Answers each ImageBuildStarted given to `worker_id` as a build worker would: push, ImagePushed.
    In every workspace: the session's log may hold other tests' requests, older than this test's,
    and the image-builder gives them to this builder first (oldest first, as it should)."""
    sub = await svc.bus.js.subscribe(subjects.filter_subject(aggregate="image", event_type="ImageBuildStarted"),
                                     ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except nats.errors.TimeoutError:
                continue
            m = decode(msg.data, msg.subject)
            ev = m.event
            assert isinstance(ev, E.ImageBuildStarted)
            if ev.builder != worker_id or any(s.image_id == ev.image_id for s in seen):
                continue  # another's, or answered by this builder before (a new subscription reads from the start)
            seen.append(ev)
            ref = image_tag(ev.image_id)
            await sh("skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:img",
                     f"docker://{registry}/{ref}")
            out = await sh("skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}",
                           f"docker://{registry}/{ref}")
            await svc.bus.publish(envelope(E.ImagePushed(
                image_id=ev.image_id, builder=worker_id, registry=registry, reference=ref, digest=out.strip(),
                step_hashes=[s.hash for s in ev.steps]), workspace=m.envelope.workspace,
                correlation_id=m.envelope.correlation_id))
    finally:
        await sub.unsubscribe()


async def events_of(svc, ws: str, image: str, until: str, timeout: float = 60.0) -> list[E.Event]:
    sub = await svc.bus.js.subscribe(subjects.filter_subject(workspace=ws, aggregate="image", aggregate_id=image),
                                     ordered_consumer=True)
    out: list[E.Event] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except nats.errors.TimeoutError:
                continue
            out.append(decode(msg.data, msg.subject).event)
            if type(out[-1]).__name__ == until:
                return out
    finally:
        await sub.unsubscribe()
    raise AssertionError(f"no {until} within {timeout} s; saw {[type(e).__name__ for e in out]}")


async def register_builder(svc, worker_id: str) -> None:
    for ev in (E.WorkerRegistered(worker_id=worker_id, pool="build", cpu_millicores=64_000, memory_mib=1024),
               E.WorkerReady(worker_id=worker_id)):
        await svc.bus.publish(envelope(ev, workspace="_sys"))


async def request(svc, ws: str, blueprint: ImageSpec) -> str:
    image = image_id(blueprint)
    await svc.bus.append(envelope(E.ImageBuildRequested(image_id=image, blueprint=blueprint, requested_by="test"),
                                  workspace=ws), 0)
    return image


async def test_a_pushed_image_is_archived_to_s3_and_built(builder_service, servers, tmp_path):
    registry = servers.get("registry")
    if not registry:
        pytest.skip("the servers fixture has no registry")
    svc, ws = builder_service, "t" + uuid7().replace("-", "")[-12:]
    worker_id = f"fakebuilder-{ws}"
    try:
        await archived_and_built(svc, ws, worker_id, registry, tmp_path)
    finally:  # the fake builder leaves the session's log: later tests see no ready builder of it
        await svc.bus.publish(envelope(E.WorkerLost(worker_id=worker_id, reason="test over"), workspace="_sys"))


async def archived_and_built(svc, ws: str, worker_id: str, registry: str, tmp_path: Path) -> None:
    files = {"srv/marker": b"built-by-levers9\n", "usr/bin/hello": b"#!/bin/sh\necho hi\n"}
    seen: list = []
    task = asyncio.create_task(fake_builder(svc, ws, worker_id, registry, oci_layout(tmp_path, files), seen))
    try:
        await register_builder(svc, worker_id)
        blueprint = ImageSpec(python_packages=["six"], commands=[f"echo {ws}"], env={"GREETING": "hi"})
        t0 = time.monotonic()
        image = await request(svc, ws, blueprint)
        events = await events_of(svc, ws, image, "ImageBuilt")
        took = time.monotonic() - t0
    finally:
        task.cancel()
    [started] = [s for s in seen if s.image_id == image]  # the fake may have answered other tests' builds
    # only the base can be cached already (another test of the session built on it): the rest is new
    assert started.steps == build_steps(blueprint) and started.attempt == 1 and started.cached_steps <= 1
    built = events[-1]
    assert isinstance(built, E.ImageBuilt) and built.archive is not None and built.size_bytes == sum(
        len(v) for v in files.values())
    assert built.location == f"s3://{built.archive.bucket}/{built.archive.index_key}"
    async with s3_client(svc.settings) as s3:
        obj = await s3.get_object(Bucket=built.archive.bucket, Key=built.archive.index_key)
        index = decode_index(await obj["Body"].read())
    paths = {f.path.lstrip("/"): f for f in index.files}
    assert {"srv/marker", "usr/bin/hello"} <= set(paths) and paths["srv/marker"].size == len(files["srv/marker"])
    print(f"\nrequest -> ImageBuilt (fake builder push + archive): {took:.2f} s")

    # the same blueprint's steps are in the layer cache now: a blueprint extending it starts after them
    longer = ImageSpec(python_packages=["six"], commands=[f"echo {ws}", "echo more"])
    task = asyncio.create_task(fake_builder(svc, ws, worker_id, registry, oci_layout(tmp_path / "b", files), seen))
    try:
        image2 = await request(svc, ws, longer)
        await events_of(svc, ws, image2, "ImageBuilt")
    finally:
        task.cancel()
    [again] = [s for s in seen if s.image_id == image2]
    assert again.cached_steps == len(build_steps(blueprint)) == len(again.steps) - 1


async def test_without_a_build_worker_the_build_waits_saying_so(builder_service):
    svc, ws = builder_service, "t" + uuid7().replace("-", "")[-12:]
    # the workers view has applied every worker event of this session's log so far
    last = await svc.bus.last_seq(subjects.filter_subject(workspace="_sys", aggregate="worker"))
    assert await svc.wait_projected(last, "workers", timeout=60)
    if await svc.pool.fetchval(f"SELECT count(*) FROM {svc.schema}.workers WHERE pool = 'build' AND status = 'ready'"):
        pytest.skip("a worker of pool build is ready in this session's log")
    image = await request(svc, ws, ImageSpec(commands=[f"echo nobody builds {ws}"]))
    events = await events_of(svc, ws, image, "ImageBuildProgress", timeout=20)
    assert "waiting for a worker of pool 'build'" in events[-1].lines[0]
    assert not any(isinstance(e, E.ImageBuildStarted) for e in events)


async def test_a_redelivered_push_appends_no_second_built(builder_service):
    """An ImagePushed handled after its image's end (a redelivery) changes nothing."""
    svc, ws = builder_service, "t" + uuid7().replace("-", "")[-12:]
    spec = ImageSpec(commands=[f"echo {ws}"])
    image = await request(svc, ws, spec)
    await svc.bus.publish(envelope(E.ImageBuildFailed(image_id=image, reason="given up"), workspace=ws))
    pushed = envelope(E.ImagePushed(image_id=image, builder="b", registry="127.0.0.1:1", reference="x:y",
                                    digest="sha256:0"), workspace=ws)
    await svc.on_event(Delivery(seq=0, subject=pushed.subject, data=msgspec.json.encode(pushed), headers={},
                                num_delivered=2, message=decode(msgspec.json.encode(pushed), pushed.subject)))
    assert await svc.last_event(ws, image) == (await svc.bus.last_seq(f"levers9.{ws}.image.{image}.*"),
                                               "ImageBuildFailed")


async def test_the_gateways_event_stream_follows_a_build_until_it_ends(builder_service):
    """GET /api/v1/images/{id}/events: NDJSON envelopes from the first; with follow, until the end."""
    from types import SimpleNamespace

    from levers9.gateway.routes_images import event_lines

    svc, ws = builder_service, "t" + uuid7().replace("-", "")[-12:]
    gw = SimpleNamespace(bus=svc.bus)
    spec = ImageSpec(commands=[f"echo {ws}"])
    image = image_id(spec)
    await svc.bus.publish(envelope(E.ImageBuildFailed(image_id=image, reason="an old failure"), workspace=ws))
    await svc.bus.publish(envelope(E.ImageBuildRequested(image_id=image, blueprint=spec), workspace=ws))
    subject = subjects.filter_subject(workspace=ws, aggregate="image", aggregate_id=image)
    now = [json.loads(line)["type"] async for line in event_lines(gw, subject, follow=False)]
    assert now[:2] == ["ImageBuildFailed", "ImageBuildRequested"] and set(now[2:]) <= {"ImageBuildProgress"}

    async def follow() -> list[str]:
        return [json.loads(line)["type"] async for line in event_lines(gw, subject, follow=True)]

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.5)
    assert not task.done()  # an old failure followed by a new request is not the end
    await svc.bus.publish(envelope(E.ImageBuilt(image_id=image, digest="sha256:0", location="s3://b/k"),
                                   workspace=ws))
    # the running image-builder may say it waits, before the end or (on a loaded machine) after it
    got = await asyncio.wait_for(task, 10)
    assert got[:2] == ["ImageBuildFailed", "ImageBuildRequested"] and "ImageBuilt" in got
    assert set(got[2:]) - {"ImageBuilt"} <= {"ImageBuildProgress"}
