"""The worker's side of checkpoint/restore, over the runtime's dump and restore: CRIU enabled (or
why not), dumps into the node cache, restores from it (filled from S3 on a miss: the sealed
archive opened, hash verified),
and the orchestration around them: whether to dump (levers9.contracts.checkpoint_policy), the
claim that makes it one dump per deployment version, the events that say what happened.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import shutil
from pathlib import Path
from typing import Protocol

import asyncpg
import httpx

from levers9.contracts import envelope, uuid7
from levers9.contracts import events as E
from levers9.contracts.checkpoint_policy import (
    NODE_CACHE,
    RUNTIME,
    DumpChoice,
    RestoreFailure,
    dump_choice,
    restore_failure_verdict,
)
from levers9.contracts.spec import CheckpointRef
from levers9.runtime.bus import Bus, ConcurrencyConflict
from levers9.runtime.config import Settings
from levers9.runtime.tasks import spawn
from levers9.worker.gpus.node import NodeGpus
from levers9.worker.images.node_cache import FAULT_HEADER, NodeCache
from levers9.worker.lifecycle.placement import Running
from levers9.worker.lifecycle.secret_source import KeyUnavailable, checkpoint_key, holds_keyring
from levers9.worker.runtime.interface import ContainerSpec, Runtime, Started
from levers9.worker.sandboxes.sandboxes import Sandboxes, is_function

from .archive import CheckpointArtifact, RestoreError
from .criu_install import CriuUnavailable
from .gpu import cuda_suspended

log = logging.getLogger("levers9.worker.checkpoints.orchestration")


class CheckpointSkipped(Exception):
    pass


async def enable_criu(runtime: Runtime, settings: Settings) -> str:
    """Check CRIU (>= 4) at worker start and arm the runtime with it; returns a note for the log,
    /healthz and the registration (the feature `criu` is advertised only when it works)."""
    if settings.worker.criu == "off":
        return "off: this worker's pool has criu = false"
    if not runtime.capabilities.checkpoints:
        return f"off: the {runtime.name} runtime cannot checkpoint"
    try:
        info = await runtime.enable_checkpoints(lambda msg: log.info("criu: %s", msg))
    except CriuUnavailable as exc:
        return f"off: {exc}"
    return f"on: CRIU {info.version} ({info.binary})"


async def dump(runtime: Runtime, container_id: str, cache: NodeCache, memory_mib: int,
               cuda: bool = False, cut_connections: bool = False) -> CheckpointArtifact:
    """Dump leave-running into a tar, then move it into the node cache under its sha256. `cuda`: a GPU
    container's CUDA processes are toggled out of the GPU around the dump (levers9.worker.checkpoints.gpu).
    `cut_connections`: a dump before a stop ends the container's outside connections first."""
    usage = runtime.memory_usage(container_id)
    if usage is not None and usage > memory_mib * 1024 * 1024:
        raise CheckpointSkipped(f"the container uses {usage >> 20} MiB, more than its limit of {memory_mib} MiB")
    if usage is not None and usage > cache.max_bytes:
        raise CheckpointSkipped(f"a dump of {usage >> 20} MiB would not fit the node cache "
                                f"({cache.max_bytes >> 20} MiB)")
    tmp = cache.root / f".dump-{container_id}.tar"
    try:
        async with cuda_suspended(container_id, cuda):  # before runc pauses it: a frozen process cannot toggle
            artifact = await runtime.checkpoint(container_id, tmp, cut_connections=cut_connections)
        cache.make_room(artifact.size_bytes)
        await asyncio.to_thread(shutil.move, tmp, cache.root / artifact.sha256)
    finally:
        tmp.unlink(missing_ok=True)
    return artifact


async def restore(runtime: Runtime, cspec: ContainerSpec, ref: CheckpointRef, cache_url: str,
                  data_key: bytes | None = None) -> Started:
    """Restore `ref` through the node cache. The gateway chose it among the `available` (stored)
    checkpoints of this deployment version, so its status is not checked again here. `data_key`: the
    sealed archive's own key, for a worker without the keyring."""
    headers = {"X-Levers9-Data-Key": base64.b64encode(data_key).decode()} if data_key else {}
    try:
        async with httpx.AsyncClient(timeout=300) as client:
            r = await client.get(f"{cache_url}/blobs/{ref.sha256}", headers=headers,
                                 params={"bucket": ref.bucket, "key": ref.key, "fill": "true", "sealed": "true",
                                         "peer": peer_of(ref.location, cache_url)})
    except httpx.TransportError as exc:  # down, refusing, or too slow: nothing about the checkpoint
        raise NodeCacheFailed(f"the node cache at {cache_url} did not answer ({type(exc).__name__}: {exc}); "
                              "is the node's first worker running?",
                              RestoreFailure(NODE_CACHE, answered=False,
                                             timed_out=isinstance(exc, httpx.TimeoutException))) from exc
    if r.status_code != 200:
        raise NodeCacheFailed(f"the node cache at {cache_url} could not get the checkpoint: {_detail(r)}",
                              RestoreFailure(NODE_CACHE, status=r.status_code, fault=r.headers.get(FAULT_HEADER, "")))
    path = Path(r.json()["path"])
    # the cache checked the sha256 when the blob entered it (a dump, a peer, S3); checking the whole
    # tar again here would cost ~0.3 s per 400 MB on every restore. The manifest and layout are
    # still checked by the runtime's unpack.
    return await runtime.restore(cspec, path)


class NodeCacheFailed(RestoreError):
    """The node cache could not hand over the checkpoint; `failure` says how (whose fault: the policy)."""

    def __init__(self, message: str, failure: RestoreFailure) -> None:
        super().__init__(message)
        self.failure = failure


MANUAL_CLAIM_TRIES = 5
TRANSIENT_CAUSES = (ConnectionError, TimeoutError, asyncio.TimeoutError, httpx.TransportError)


def failure_of(exc: BaseException) -> RestoreFailure:
    """A failed restore as the policy's plain values: the node cache's answer, or the runtime's
    error (transient when a connection or a timeout caused it, anywhere in its chain of causes)."""
    if isinstance(exc, NodeCacheFailed):
        return exc.failure
    chain: BaseException | None = exc
    seen = 0
    while chain is not None and seen < 16:
        if isinstance(chain, TRANSIENT_CAUSES):
            return RestoreFailure(RUNTIME, timed_out=isinstance(chain, (TimeoutError, asyncio.TimeoutError)),
                                  transient_cause=True)
        chain, seen = chain.__cause__ or chain.__context__, seen + 1
    return RestoreFailure(RUNTIME)


def peer_of(location: str, cache_url: str) -> str:
    """The node cache that dumped a checkpoint (its `location`, another node's), to fill from before S3."""
    base = location.split("/blobs/", 1)[0] if location.startswith("http") and "/blobs/" in location else ""
    return "" if base.rstrip("/") == cache_url.rstrip("/") else base


def _detail(r: httpx.Response) -> str:
    try:
        return str(r.json().get("detail", r.text))
    except ValueError:
        return r.text


class Worker(Protocol):
    """What the orchestration uses of its worker, read at each use: the runtime is chosen when the
    worker starts, the bus and the pool exist once it is connected."""

    @property
    def worker_id(self) -> str: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def runtime(self) -> Runtime: ...
    @property
    def bus(self) -> Bus: ...
    @property
    def pool(self) -> asyncpg.Pool: ...
    @property
    def cache(self) -> NodeCache: ...
    @property
    def cache_url(self) -> str: ...
    @property
    def gpus(self) -> NodeGpus: ...
    @property
    def sandboxes(self) -> Sandboxes: ...

    async def emit(self, c: Running, event: E.Event) -> None: ...


class Checkpoints:
    """Dumps and restores of one worker: at most one dump per deployment at a time on this worker,
    one per deployment version across workers (the claim), every outcome an event."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.dumping: set[str] = set()  # deployment ids with a dump in progress here
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}  # per deployment: its lock, how many hold or wait

    async def warm(self, ref: CheckpointRef) -> None:
        """Fetch a checkpoint into the node cache and unpack it before any restore asks for it: the
        first restore of a shared checkpoint then costs what the later ones do."""
        runtime = self.worker.runtime
        if not runtime.capabilities.warm_checkpoints or not ref.sha256:
            return
        try:
            async with httpx.AsyncClient(timeout=600) as client:
                r = await client.get(f"{self.worker.cache_url}/blobs/{ref.sha256}",
                                     params={"bucket": ref.bucket, "key": ref.key, "fill": "true", "sealed": "true"})
            if r.status_code != 200:
                raise RestoreError(_detail(r))
            await runtime.warm(Path(r.json()["path"]))
            log.info("checkpoint %s fetched and unpacked ahead of its restores", ref.checkpoint_id)
        except Exception as exc:  # noqa: BLE001 - only a head start: the restore fetches it anyway
            log.warning("could not warm checkpoint %s: %s", ref.checkpoint_id, exc)

    def after_ready(self, c: Running) -> None:
        """A container just became ready: dump it when the policy says so (in the background)."""
        choice = dump_choice(c.spec, criu_ready=self.worker.runtime.checkpoint_ready, restored=bool(c.restored_from))
        if choice.dump and not self.worker.gpus.checkpoint_refusal(c.spec):  # said in its ContainerStarted note
            spawn(self.checkpoint(c), name=f"checkpoint {c.container_id}", logger=log)

    def requested(self, c: Running) -> None:
        """A user asked for a dump of this (ready) container."""
        spawn(self.checkpoint(c, manual=True), name=f"checkpoint {c.container_id}", logger=log)

    async def restore(self, c: Running, cspec: ContainerSpec, ref: CheckpointRef) -> tuple[Started | None, str]:
        """Restore from the node cache (filled from S3 on a miss, hash verified). On any failure the
        container starts cold (the caller does that); only a failure that is the checkpoint's own
        fault (restore_failure_verdict) marks it restore_failed: after a transient one (the node cache
        or S3 unreachable, a timeout) it stays available and the next start tries it again."""
        ck = ref.checkpoint_id
        w = self.worker
        data_key = None
        if not holds_keyring(w.settings) and not (w.cache.root / ref.sha256).is_file():  # a hit needs no key
            try:
                data_key = await checkpoint_key(w.settings, c, ck)
            except KeyUnavailable as exc:  # not the checkpoint's fault: it is not marked failed
                return None, f"cold: {ck} is sealed and this worker holds no keyring: {exc}"[:500]
        try:
            started = await restore(w.runtime, cspec, ref, w.cache_url, data_key)
            return started, f"restored from {ck}"
        except Exception as exc:  # noqa: BLE001 - a failed restore is never fatal: cold start instead
            reason = f"{type(exc).__name__}: {exc}"
            verdict = restore_failure_verdict(failure_of(exc))
            if not verdict.its_own:
                log.warning("restore of %s from %s failed for a transient reason (%s), starting cold; the "
                            "checkpoint stays available: %s", c.container_id, ck, verdict.why, reason)
                return None, (f"cold: restore of {ck} failed for a transient reason ({verdict.why}); it stays "
                              f"available and the next start tries it again: {reason}")[:500]
            log.warning("restore of %s from %s failed, starting cold: %s", c.container_id, ck, reason)
            await w.emit(c, E.CheckpointFailed(checkpoint_id=ck, stage="restore", reason=reason,
                                               deployment_id=c.deployment_id, worker_id=w.worker_id))
            return None, f"cold: restore of {ck} failed: {reason}"[:500]

    async def checkpoint(self, c: Running, manual: bool = False, stopping: bool = False) -> None:
        """Dump a ready container leave-running, at most one dump per deployment at a time here.
        An automatic dump is skipped while one of its deployment runs (one checkpoint is what it
        wants); one that was asked for (a sandbox's snapshot, a notebook's idle dump) waits its turn:
        two same-option sandboxes share a deployment, and the second snapshot was dropped and its
        caller waited 300 s for a 504. `stopping`: the container stops next (before_stop)."""
        if c.deployment_id in self.dumping and not manual:
            return
        lock, users = self._turns.get(c.deployment_id, (asyncio.Lock(), 0))
        self._turns[c.deployment_id] = (lock, users + 1)
        try:
            async with lock:
                self.dumping.add(c.deployment_id)
                try:
                    claim = await self.claim(c, manual)
                    if claim is not None:
                        await self._dump(c, claim, stopping)
                finally:
                    self.dumping.discard(c.deployment_id)
        finally:
            lock, users = self._turns[c.deployment_id]
            if users == 1:
                del self._turns[c.deployment_id]
            else:
                self._turns[c.deployment_id] = (lock, users - 1)

    async def before_stop(self, c: Running) -> None:
        """A box with idle_checkpoint (a notebook) is dumped before it stops, so that its next start
        restores its memory as it is now, not as it was when it first answered (after a dump of its
        deployment already running here). It never holds up the stop for good: a failed dump is a
        CheckpointFailed, and the stop goes on."""
        await self.checkpoint(c, manual=True, stopping=True)

    async def _dump(self, c: Running, claim: str, stopping: bool = False) -> None:
        w = self.worker
        # a function sandbox's executor must have no connection from outside while CRIU dumps it
        quiet = w.sandboxes.relay.quiet(c.container_id) if is_function(c.spec) else contextlib.nullcontext()
        try:
            async with quiet:
                dumped = await dump(w.runtime, c.container_id, w.cache, c.memory_mib,
                                    cuda=bool(c.spec and c.spec.resources.gpus), cut_connections=stopping)
        except Exception as exc:  # noqa: BLE001 - whatever failed, it is recorded as CheckpointFailed with its reason
            log.warning("checkpoint of %s skipped: %s", c.container_id, exc)
            await w.emit(c, E.CheckpointFailed(checkpoint_id=claim, stage="dump", reason=str(exc)[:1000],
                                               deployment_id=c.deployment_id, worker_id=w.worker_id))
            return
        await w.emit(c, E.CheckpointDumped(
            checkpoint_id=claim, deployment_id=c.deployment_id, deployment_version=c.deployment_version,
            container_id=c.container_id, worker_id=w.worker_id, runtime=w.runtime.name,
            accelerator=w.gpus.inventory.gpu_type if c.spec and c.spec.resources.gpus else "",  # restored on the same
            size_bytes=dumped.size_bytes, sha256=dumped.sha256, location=f"{w.cache_url}/blobs/{dumped.sha256}",
            image_id=dumped.manifest.get("image_id", "")))
        log.info("checkpoint %s of %s: %d bytes in %.2f s", claim, c.container_id, dumped.size_bytes, dumped.seconds)

    async def claim(self, c: Running, manual: bool) -> str | None:
        """A new checkpoint id claimed for this deployment (DeploymentCheckpointClaimed, appended with
        optimistic concurrency on the deployment), or None when the policy or another worker says no."""
        w = self.worker
        dep = await w.pool.fetchrow("SELECT last_seq, checkpoint_claim FROM worker.deployments WHERE workspace=$1 "
                                    "AND deployment_id=$2", c.workspace, c.deployment_id)
        if dep is None:
            return None
        choice = await self._choice(c, manual, dep)
        if not choice.dump:
            log.info("no checkpoint of %s: %s", c.container_id, choice.why)
            if manual:  # a user asked: say why not where they look (the checkpoint list)
                await w.emit(c, E.CheckpointFailed(checkpoint_id=uuid7(), stage="dump", reason=choice.why,
                                                   deployment_id=c.deployment_id, worker_id=w.worker_id))
            return None
        checkpoint_id = uuid7()
        env = envelope(E.DeploymentCheckpointClaimed(
            deployment_id=c.deployment_id, checkpoint_id=checkpoint_id, worker_id=w.worker_id,
            container_id=c.container_id), workspace=c.workspace, correlation_id=c.correlation_id)
        expected = dep["last_seq"]
        for _ in range(MANUAL_CLAIM_TRIES if manual else 1):
            try:
                await w.bus.append(env, expected)
                return checkpoint_id
            except ConcurrencyConflict:
                if not manual:
                    return None  # another worker claimed it first
                # one asked for is of this container and excludes nobody: the deployment's log moved
                # on (the last dump's own events, which this worker's projection may not have read
                # yet), so claim again after it
                expected = await w.bus.last_seq(w.bus.aggregate_filter(env))
        if manual:
            await w.emit(c, E.CheckpointFailed(checkpoint_id=checkpoint_id, stage="dump", deployment_id=c.deployment_id,
                                               worker_id=w.worker_id, reason="the deployment's log kept moving while "
                                               f"the dump was claimed ({MANUAL_CLAIM_TRIES} tries): ask again"))
        return None

    async def _choice(self, c: Running, manual: bool, dep: asyncpg.Record) -> DumpChoice:
        w = self.worker
        gpu_refusal = w.gpus.checkpoint_refusal(c.spec)  # no driver 570+, cuda-checkpoint or CUDA plugin here
        if gpu_refusal:
            return DumpChoice(False, gpu_refusal)
        has_one = claimed = False
        if not manual:
            has_one = bool(await w.pool.fetchval(
                "SELECT count(*) FROM worker.checkpoints WHERE workspace=$1 AND deployment_id=$2 "
                "AND status IN ('dumped', 'available')", c.workspace, c.deployment_id))
            # claimed and not dumped yet (no row): another worker is dumping it now
            claimed = bool(dep["checkpoint_claim"]) and await w.pool.fetchval(
                "SELECT status FROM worker.checkpoints WHERE workspace=$1 AND checkpoint_id=$2",
                c.workspace, dep["checkpoint_claim"]) is None
        return dump_choice(c.spec, criu_ready=w.runtime.checkpoint_ready, restored=bool(c.restored_from),
                           manual=manual, version_has_checkpoint=has_one, claimed_elsewhere=claimed)
