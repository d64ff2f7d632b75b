"""The image-builder process: owns each build's lifecycle; never builds anything itself.

- Dispatch (a loop woken whenever its views move): a requested build goes to a ready worker of the
  `build` pool with the steps the layer cache already holds (ImageBuildStarted); a build whose
  builder was lost goes to another one; nobody to take it: it says so now and then and fails after
  a bound (decide.plan says which). Every append names the image subject's last sequence as the
  view saw it, so a second replica, or a view that lags, loses the race instead of appending twice.
- ImagePushed: the builder pushed the image. It is copied out of the registry, unpacked, written to
  S3 as an archive and its index (levers9.runtime.image_archive), and ImageBuilt appended; or
  ImageBuildFailed with why. A redelivery after a terminal event does nothing.
- ImageDeleted: the registry tag goes, and the S3 objects that no other built image shares.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from pathlib import Path
from typing import Any

import msgspec
import nats.js.errors

from levers9.contracts import Envelope, caused_by, envelope, subjects
from levers9.contracts import events as E
from levers9.contracts.images import build_steps
from levers9.contracts.spec import ArchiveRef, ImageSpec
from levers9.runtime.bus import ConcurrencyConflict
from levers9.runtime.consumer import Delivery, WorkConsumer
from levers9.runtime.off_loop import scratch_dir
from levers9.runtime.projection import Projection
from levers9.runtime.service import Service
from levers9.runtime.storage import s3_client, workspace_bucket
from levers9.runtime.views import ImageBuildsView, WorkersView

from . import oci
from .cache import LayerCacheView, cached_hashes
from .decide import BUILD_POOL, Build, Fail, Start, Wait, Worker, plan

log = logging.getLogger("levers9.image_builder")

TERMINAL = ("ImageBuilt", "ImageBuildFailed", "ImageDeleted")
DISPATCH_EVERY_S = 2.0  # also without news: waiting builds time out, lost builders are noticed
APPEND_TRIES = 5


def image_filter(workspace: str, image_id: str) -> str:
    return subjects.filter_subject(workspace=workspace, aggregate="image", aggregate_id=image_id)


class ImageBuilderService(Service):
    name = "image-builder"
    projections = (ImageBuildsView(), WorkersView(), LayerCacheView())
    deliver_new = False  # a test's replica starts at the end of the log

    def __init__(self, settings) -> None:
        super().__init__(settings)
        self.wake = asyncio.Event()
        self.last_said: dict[str, dt.datetime] = {}

    def reactions(self) -> list[WorkConsumer]:
        return [WorkConsumer(self.bus, f"{self.schema}-archives",
                             [subjects.filter_subject(aggregate="image", event_type="ImagePushed"),
                              subjects.filter_subject(aggregate="image", event_type="ImageDeleted")],
                             handle=self.on_event, max_deliver=3, ack_wait=1800, batch=1,
                             deliver_new=self.deliver_new)]

    def background(self):
        return [self.dispatch_loop]

    async def apply(self, p: Projection, batch: list[Delivery]) -> None:
        await super().apply(p, batch)
        if p.name in ("builds", "workers"):
            self.wake.set()

    # ---- dispatch ----------------------------------------------------------------------------------

    async def dispatch_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.wake.wait(), DISPATCH_EVERY_S)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()
            try:
                await self.dispatch(dt.datetime.now(dt.timezone.utc))
            except Exception:  # noqa: BLE001 - the next pass tries again; a dead loop would stop the service
                log.exception("dispatch failed; trying again")

    async def dispatch(self, now: dt.datetime) -> None:
        builds = [build_of(r) for r in await self.pool.fetch(
            f"""SELECT workspace, image_id, status, blueprint, last_seq, builder, attempt, requested_at, started_at
                FROM {self.schema}.builds WHERE status IN ('requested', 'building')""")]
        workers = [Worker(r["worker_id"], r["pool"], r["status"], r["cordoned"], r["cpu_millicores"])
                   for r in await self.pool.fetch(f"""SELECT worker_id, pool, status, cordoned, cpu_millicores
                                                     FROM {self.schema}.workers WHERE pool = $1""", BUILD_POOL)]
        hashes = {s.hash for b in builds for s in build_steps(b.blueprint)}
        cached = await cached_hashes(self.pool, self.schema, hashes) if hashes else set()
        for decision in plan(builds, workers, cached, now, self.last_said):
            await self.carry_out(decision, now)

    async def carry_out(self, decision: Start | Fail | Wait, now: dt.datetime) -> None:
        b = decision.build
        if isinstance(decision, Wait):
            self.last_said[b.image_id] = now
            log.info("image %s: %s", b.image_id, decision.message)
            await self.bus.publish(envelope(E.ImageBuildProgress(image_id=b.image_id, step=0, total=0, state="log",
                                                                 lines=[decision.message]), workspace=b.workspace))
            return
        event: E.Event
        if isinstance(decision, Start):
            event = E.ImageBuildStarted(image_id=b.image_id, builder=decision.builder, attempt=decision.attempt,
                                        blueprint=b.blueprint, steps=decision.steps,
                                        cached_steps=decision.cached_steps)
        else:
            event = E.ImageBuildFailed(image_id=b.image_id, reason=decision.reason, step=-1)
        try:
            appended = await self.bus.append(envelope(event, workspace=b.workspace), b.last_seq)
        except ConcurrencyConflict:  # the log moved on (another replica, or our view lags): next pass
            return
        self.last_said.pop(b.image_id, None)
        log.info("image %s: %s", b.image_id, f"given to {decision.builder} (attempt {decision.attempt}, "
                 f"{decision.cached_steps} cached steps)" if isinstance(decision, Start) else decision.reason)
        await self.wait_projected(appended.seq, "builds")

    # ---- reactions -----------------------------------------------------------------------------------

    async def on_event(self, d: Delivery) -> None:
        assert d.message is not None  # the consumer dead-letters what does not decode
        env, ev = d.message.envelope, d.message.event
        if isinstance(ev, E.ImagePushed):
            await self.on_pushed(env, ev)
        elif isinstance(ev, E.ImageDeleted):
            await self.on_deleted(env.workspace, ev.image_id)

    async def last_event(self, workspace: str, image_id: str) -> tuple[int, str]:
        """(sequence, type) of the image's last event; (0, "") when it has none."""
        try:
            msg = await self.bus.js.get_last_msg(subjects.STREAM, image_filter(workspace, image_id))
        except nats.js.errors.NotFoundError:
            return 0, ""
        return msg.seq or 0, (msg.subject or "").rsplit(".", 1)[-1]

    async def finish(self, cause: Envelope, event: E.ImageBuilt | E.ImageBuildFailed) -> bool:
        """Append the build's end unless it has one; progress appended meanwhile is no conflict of
        substance, so the append is retried after it. -> whether this call appended it."""
        for _ in range(APPEND_TRIES):
            seq, last = await self.last_event(cause.workspace, event.image_id)
            if last in TERMINAL:
                return False
            try:
                await self.bus.append(caused_by(cause, event), seq)
                return True
            except ConcurrencyConflict:
                continue
        raise RuntimeError(f"image {event.image_id}: the log kept moving; giving the delivery back")

    async def on_pushed(self, env: Envelope, ev: E.ImagePushed) -> None:
        _, last = await self.last_event(env.workspace, ev.image_id)
        if last in TERMINAL:
            return  # a redelivery: decided already
        started = time.monotonic()
        row = await self.pool.fetchrow(f"SELECT started_at, steps FROM {self.schema}.builds WHERE workspace=$1 "
                                       "AND image_id=$2", env.workspace, ev.image_id)
        total = len(json.loads(row["steps"] or "[]")) if row else 0
        try:
            archive, size = await self.archive(env, ev, total)
        except Exception as exc:  # noqa: BLE001 - every failure ends the build with its reason
            log.warning("image %s not archived: %s", ev.image_id, exc)
            await self.finish(env, E.ImageBuildFailed(image_id=ev.image_id, step=-1,
                                                      reason=f"archiving the image failed: {exc}"))
            return
        since = row["started_at"] if row and row["started_at"] else None
        seconds = (dt.datetime.now(dt.timezone.utc) - since).total_seconds() if since else \
            time.monotonic() - started
        await self.finish(env, E.ImageBuilt(image_id=ev.image_id, digest=ev.digest, reference=ev.reference,
                                            location=f"s3://{archive.bucket}/{archive.index_key}",
                                            size_bytes=size, archive=archive, seconds=round(seconds, 3)))
        log.info("image %s built: %d bytes, %d files, archive s3://%s/%s", ev.image_id, size, archive.files,
                 archive.bucket, archive.key)

    async def archive(self, env: Envelope, ev: E.ImagePushed, total: int) -> tuple[ArchiveRef, int]:
        """Registry -> OCI layout -> root fs -> archive and index in the workspace's bucket."""
        from levers9.runtime.image_archive import upload_image

        async def say(line: str) -> None:
            await self.bus.publish(caused_by(env, E.ImageBuildProgress(
                image_id=ev.image_id, builder="image-builder", step=max(0, total - 1), total=total, state="log",
                lines=[line])))

        async with scratch_dir(f"levers9-{ev.image_id}-", self.scratch()) as tmp:
            layout, root = tmp / "layout", tmp / "root"
            t0 = time.monotonic()
            await oci.pull(ev.registry, ev.reference, layout)
            count = await asyncio.to_thread(oci.unpack, layout, root)
            size = await asyncio.to_thread(oci.tree_bytes, root)
            await say(f"pulled {ev.reference} ({count} layers, {size / 2**20:.1f} MiB) in "
                      f"{time.monotonic() - t0:.1f} s; archiving to S3")
            lines: list[str] = []
            archive = await upload_image(self.settings, root, ev.image_id, workspace_bucket(env.workspace),
                                         progress=lines.append)
            await say(lines[-1] if lines else "archived")
        return archive, size

    def scratch(self) -> str | None:
        """Where images are unpacked: the machine's image cache (large images), else the temp dir."""
        path = Path(self.settings.images.image_cache) / "image-builder"
        try:
            path.mkdir(parents=True, exist_ok=True)
            return str(path)
        except OSError:
            return None

    async def on_deleted(self, workspace: str, image_id: str) -> None:
        row = await self.pool.fetchrow(f"SELECT registry, reference, archive FROM {self.schema}.builds "
                                       "WHERE workspace=$1 AND image_id=$2", workspace, image_id)
        if row is None:
            return
        shared = await self.pool.fetchval(f"""SELECT count(*) FROM {self.schema}.builds WHERE image_id=$1
                                              AND workspace <> $2 AND status = 'built'""", image_id, workspace)
        if row["registry"] and row["reference"] and not shared:
            try:
                await oci.delete(row["registry"], row["reference"])
            except oci.PullFailed as exc:  # a registry without deletes enabled keeps the tag: not fatal
                log.warning("image %s: %s", image_id, exc)
        if row["archive"]:
            await self.delete_unshared(workspace, image_id, json.loads(row["archive"]))

    async def delete_unshared(self, workspace: str, image_id: str, archive: dict[str, Any]) -> None:
        """S3 objects are content addressed: another built image may hold the same archive or index."""
        async with s3_client(self.settings) as s3:
            for key in (archive.get("key"), archive.get("index_key")):
                if not key:
                    continue
                users = await self.pool.fetchval(
                    f"""SELECT count(*) FROM {self.schema}.builds WHERE status = 'built'
                        AND (archive->>'key' = $1 OR archive->>'index_key' = $1)
                        AND NOT (workspace = $2 AND image_id = $3)""", key, workspace, image_id)
                if not users:
                    await s3.delete_object(Bucket=archive["bucket"], Key=key)

    async def health_detail(self) -> dict[str, Any]:
        waiting = await self.pool.fetchval(f"SELECT count(*) FROM {self.schema}.builds WHERE status = 'requested'")
        return {"builds_waiting": waiting}


def build_of(r: Any) -> Build:
    blueprint = r["blueprint"]
    return Build(workspace=r["workspace"], image_id=r["image_id"], status=r["status"],
                 blueprint=msgspec.convert(json.loads(blueprint) if isinstance(blueprint, str) else blueprint or {},
                                           ImageSpec),
                 last_seq=r["last_seq"], builder=r["builder"], attempt=r["attempt"], requested_at=r["requested_at"],
                 started_at=r["started_at"])
