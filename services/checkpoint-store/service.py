"""The checkpoint-store process: checkpoint blobs in S3, their rows, their status.

On CheckpointDumped it streams the tar from the dumping node's cache into the workspace's bucket
(multipart, 8 MiB parts, each part retried), sealed on the way (a checkpoint's memory holds its
container's environment, secrets included: AES-256-GCM under a fresh data key wrapped by the
secrets keyring's primary KEK, bound to the object's location; levers9.runtime.sealing), checks the
plaintext's size and sha256, and appends CheckpointStored;
while S3 is unreachable the checkpoint stays dumped and the event is retried (a transient failure
for the consumer) until S3 is back, so an outage loses no checkpoint; so is the dumping node's cache
while it does not answer (or answers 5xx): the dump is there, its node is restarting or cut off for a
while (seen: two new dumps lost to a node cache down for a minute), for up to NODE_CACHE_PATIENCE_S
after the dump (then its node is taken for gone); any other failure ends it with
CheckpointFailed (stage upload). A checkpoint of a
deployment that was deleted meanwhile is refused. CheckpointDeleted removes the object. A box dumped
when idle (a notebook) keeps its newest dumps only (pruning.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import logging
import time
from typing import AsyncIterator

import httpx
from tenacity import AsyncRetrying, retry_if_not_exception_type, stop_after_attempt, wait_exponential

from levers9.contracts import caused_by, subjects
from levers9.contracts import events as E
from levers9.contracts.ids import InvalidName
from levers9.runtime.consumer import Delivery, WorkConsumer
from levers9.runtime.sealing import ArchiveSealer
from levers9.runtime.secrets import checkpoint_context, keyring
from levers9.runtime.service import Service
from levers9.runtime.storage import S3_UNREACHABLE, S3Unavailable, s3_client, workspace_bucket
from levers9.runtime.views import CheckpointsView, ContainersView, DeploymentsView

from .pruning import prune_idle_dumps

log = logging.getLogger("levers9.checkpoint_store")

PART_BYTES = 8 * 1024 * 1024
UPLOAD_ATTEMPTS = 4


class UploadFailed(Exception):
    pass


NODE_CACHE_PATIENCE_S = 900.0  # a dump's node cache that stays silent this long after the dump: the node is gone


def waited_s(occurred_at: str, now: float | None = None) -> float:
    """Seconds since an envelope's `occurred_at` (0 when it does not parse)."""
    try:
        then = dt.datetime.strptime(occurred_at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return 0.0
    return max(0.0, (time.time() if now is None else now) - then.timestamp())


class NodeCacheUnavailable(ConnectionError):
    """Transient: the dumping node's cache did not answer; the consumer tries the event again."""


class ProjectionBehind(ConnectionError):
    """Transient: the consumer tries the event again once this service's projection has caught up."""


class CheckpointStoreService(Service):
    name = "checkpoint-store"
    # containers: which worker each container is placed on, so a dump is taken only from that worker
    projections = (CheckpointsView(), DeploymentsView(), ContainersView())

    def s3(self):
        return s3_client(self.settings)

    def reactions(self):
        return [WorkConsumer(self.bus, "checkpoint-store-uploads",
                             [subjects.filter_subject(aggregate="checkpoint", event_type="CheckpointDumped"),
                              subjects.filter_subject(aggregate="checkpoint", event_type="CheckpointDeleted")],
                             handle=self.on_event, max_deliver=3, ack_wait=300, batch=1)]

    async def on_event(self, d: Delivery) -> None:
        assert d.message is not None  # the consumer dead-letters what does not decode
        env, ev = d.message.envelope, d.message.event
        if isinstance(ev, E.CheckpointDeleted):
            await self.delete_object(env.workspace, ev.checkpoint_id)
            return
        if not isinstance(ev, E.CheckpointDumped):
            return
        status = await self.pool.fetchval("SELECT status FROM checkpoint_store.checkpoints WHERE workspace=$1 AND "
                                          "checkpoint_id=$2", env.workspace, ev.checkpoint_id)
        if status in ("available", "checkpoint_failed", "deleted"):
            return  # already decided: a redelivery
        dep_status = await self.pool.fetchval("SELECT status FROM checkpoint_store.deployments WHERE workspace=$1 "
                                              "AND deployment_id=$2", env.workspace, ev.deployment_id)
        if dep_status == "deleted":
            await self.bus.publish(caused_by(env, E.CheckpointFailed(
                checkpoint_id=ev.checkpoint_id, stage="upload", reason="its deployment was deleted",
                deployment_id=ev.deployment_id, worker_id=ev.worker_id)))
            return
        refused = await self.not_its_worker(env.workspace, ev)
        if refused:
            log.warning("checkpoint %s refused: %s", ev.checkpoint_id, refused)
            await self.bus.publish(caused_by(env, E.CheckpointFailed(
                checkpoint_id=ev.checkpoint_id, stage="upload", reason=refused,
                deployment_id=ev.deployment_id, worker_id=ev.worker_id)))
            return
        bucket, key = workspace_bucket(env.workspace), f"checkpoints/{ev.deployment_id}/{ev.checkpoint_id}.tar"
        try:
            size, sha = await self.upload(ev.location, bucket, key)
            if sha != ev.sha256 or size != ev.size_bytes:
                raise UploadFailed(f"the node served {size} bytes hashing to {sha}; the dump recorded "
                                   f"{ev.size_bytes} bytes hashing to {ev.sha256}")
        except S3_UNREACHABLE as exc:
            log.warning("checkpoint %s waits for S3: %s", ev.checkpoint_id, exc)
            raise S3Unavailable(f"S3 is unreachable: {exc}") from exc
        except NodeCacheUnavailable as exc:
            waited = waited_s(env.occurred_at)
            if waited < NODE_CACHE_PATIENCE_S:
                log.warning("checkpoint %s waits for its node cache: %s", ev.checkpoint_id, exc)
                raise
            await self.bus.publish(caused_by(env, E.CheckpointFailed(  # its node is gone, not restarting
                checkpoint_id=ev.checkpoint_id, stage="upload", deployment_id=ev.deployment_id,
                worker_id=ev.worker_id, reason=f"its node cache has not answered for {waited / 60:.0f} min: {exc}")))
            return
        except Exception as exc:  # noqa: BLE001 - every other failure ends the checkpoint with its reason
            log.warning("checkpoint %s not stored: %s", ev.checkpoint_id, exc)
            await self.bus.publish(caused_by(env, E.CheckpointFailed(
                checkpoint_id=ev.checkpoint_id, stage="upload", reason=f"{type(exc).__name__}: {exc}",
                deployment_id=ev.deployment_id, worker_id=ev.worker_id)))
            return
        await self.bus.publish(caused_by(env, E.CheckpointStored(checkpoint_id=ev.checkpoint_id, bucket=bucket,
                                                                 key=key, size_bytes=size, sha256=sha)))
        log.info("checkpoint %s stored: %d bytes in s3://%s/%s", ev.checkpoint_id, size, bucket, key)
        await prune_idle_dumps(self.pool, self.bus.publish, env, ev)  # a notebook's older idle dumps

    async def not_its_worker(self, workspace: str, ev: E.CheckpointDumped) -> str | None:
        """Why a dump is refused, or None: only the worker its container is placed on may hand in a
        container's checkpoint (another worker could otherwise have any deployment restored from a
        process image of its own). The report's sender is checked by the consumer (bus_signing)."""
        try:
            last = await self.bus.last_seq(subjects.filter_subject(workspace=workspace, aggregate="container",
                                                                  aggregate_id=ev.container_id))
        except InvalidName:
            last = 0
        if not last:
            return f"container {ev.container_id!r} of this checkpoint has no events"
        if not await self.wait_projected(last, "containers", timeout=30):
            raise ProjectionBehind(f"the containers projection has not reached {last} yet")
        placed = await self.pool.fetchval("SELECT worker_id FROM checkpoint_store.containers WHERE workspace=$1 "
                                          "AND container_id=$2", workspace, ev.container_id)
        if placed != ev.worker_id:
            return (f"dumped by worker {ev.worker_id!r}, but container {ev.container_id} is placed on "
                    f"{placed or 'no worker'!r}: refused")
        return None

    async def upload(self, location: str, bucket: str, key: str) -> tuple[int, str]:
        """Stream the node's blob, sealed, into a multipart upload; each part retried with backoff.
        Returns the plaintext's size and sha256 (what the dump recorded, what a restore checks)."""
        digest, size = hashlib.sha256(), 0
        # no key, no upload: a checkpoint never reaches S3 in clear
        sealer = ArchiveSealer(keyring(self.settings), checkpoint_context(bucket, key))
        parts: list[dict] = []
        async with self.s3() as s3, httpx.AsyncClient(timeout=120) as http:
            await self._retry(lambda: self.ensure_bucket(s3, bucket))
            upload = await self._retry(lambda: s3.create_multipart_upload(Bucket=bucket, Key=key))
            upload_id = upload["UploadId"]
            try:
                async with _from_node(http, location) as r:
                    if r.status_code >= 500:
                        raise NodeCacheUnavailable(f"the node cache answered {r.status_code} for {location}")
                    if r.status_code != 200:
                        raise UploadFailed(f"the node cache answered {r.status_code} for {location}")
                    buffer = bytearray(sealer.header())
                    async for chunk in r.aiter_bytes(1 << 20):
                        digest.update(chunk)
                        size += len(chunk)
                        buffer += sealer.update(chunk)
                        if len(buffer) >= PART_BYTES:
                            parts.append(await self.part(s3, bucket, key, upload_id, len(parts) + 1, bytes(buffer)))
                            buffer.clear()
                    buffer += sealer.finish()
                    if buffer or not parts:
                        parts.append(await self.part(s3, bucket, key, upload_id, len(parts) + 1, bytes(buffer)))
                await self._retry(lambda: s3.complete_multipart_upload(
                    Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}))
            except BaseException:
                try:
                    await s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
                except Exception:  # noqa: BLE001 - S3 may be the thing that is down
                    pass
                raise
        return size, digest.hexdigest()

    async def part(self, s3, bucket: str, key: str, upload_id: str, number: int, data: bytes) -> dict:
        r = await self._retry(lambda: s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id,
                                                     PartNumber=number, Body=data))
        return {"PartNumber": number, "ETag": r["ETag"]}

    async def ensure_bucket(self, s3, bucket: str) -> None:
        try:
            await s3.head_bucket(Bucket=bucket)
        except Exception:  # noqa: BLE001 - missing
            await s3.create_bucket(Bucket=bucket)

    async def _retry(self, call):
        # S3 unreachable is not retried here: botocore already retried the connection, and the
        # consumer tries the whole event again until S3 is back
        async for attempt in AsyncRetrying(stop=stop_after_attempt(UPLOAD_ATTEMPTS), reraise=True,
                                           retry=retry_if_not_exception_type(S3_UNREACHABLE),
                                           wait=wait_exponential(0.5, max=4)):
            with attempt:
                return await call()

    async def delete_object(self, workspace: str, checkpoint_id: str) -> None:
        row = await self.pool.fetchrow("SELECT bucket, key FROM checkpoint_store.checkpoints WHERE workspace=$1 AND "
                                       "checkpoint_id=$2", workspace, checkpoint_id)
        if row and row["bucket"]:
            async with self.s3() as s3:
                await s3.delete_object(Bucket=row["bucket"], Key=row["key"])

    async def checks(self) -> dict[str, str]:
        out = await super().checks()
        if not self.settings.storage.s3_endpoint:
            out["s3"] = "LEVERS9_S3_ENDPOINT is not set"
            return out
        try:
            async with self.s3() as client:
                await asyncio.wait_for(client.list_buckets(), timeout=3)
            out["s3"] = "ok"
        except Exception as exc:  # noqa: BLE001 - health reports, never raises
            out["s3"] = f"error: {exc}"
        return out


@contextlib.asynccontextmanager
async def _from_node(http: httpx.AsyncClient, location: str) -> AsyncIterator[httpx.Response]:
    """The dumping node's blob, streamed; a node cache that does not answer is transient (not the
    checkpoint's fault: it is tried again, never failed for it)."""
    try:
        async with http.stream("GET", location) as r:
            yield r
    except httpx.TransportError as exc:
        raise NodeCacheUnavailable(f"the node cache at {location.split('/blobs/')[0]} did not answer "
                                   f"({type(exc).__name__}: {exc})") from exc
