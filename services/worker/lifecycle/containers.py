"""The containers placed on this worker, from placement to end: started (or restored), polled until
ready, stopped, watched for exits, and stopped when idle or when the worker drains.

- A placement (its staleness is decided by the worker's handler first): the code archive from the
  gateway (levers9.worker.lifecycle.code), secrets opened (secret_source), the ContainerSpec built
  (volumes, GPU cards, a function sandbox's fields), the container restored from its checkpoint or
  started cold (ContainerStarted), its runner's health polled until ready (ContainerReady with the
  address) or failed (ContainerFailed with the reason from the log).
- A monitor loop notices containers that exit or run out of memory, stops function sandboxes idle for
  their keep-warm (the rule is levers9.worker.lifecycle.idle; a session's sandbox lives by it), or
  every one when the worker drains. Endpoints, ASGI apps, task queues, scheduled and deployed
  functions are scaled by the scheduler's autoscaler alone (levers9.contracts.autoscaling.governed):
  it appends ContainerStopRequested with its reason, which the worker obeys. A session's sandbox of
  a deployed function (its placement names a session_id) is not the autoscaler's: the worker's
  keep-warm stays its backstop should the gateway that sweeps idle sessions be gone.

`Containers` is also the read-only mapping of the live containers (id -> Running) that the routes,
the heartbeat and the restart report read. It is given the narrow parts it uses (`ContainerParts`),
not the worker service.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from levers9.contracts import Envelope, envelope
from levers9.contracts import events as E
from levers9.contracts.autoscaling import governed
from levers9.contracts.checkpoint_policy import idle_checkpoint
from levers9.runtime.config import Settings
from levers9.runtime.tasks import spawn
from levers9.worker.checkpoints.orchestration import Checkpoints
from levers9.worker.gpus.node import NodeGpus
from levers9.worker.mounts.volumes import WorkerVolumes
from levers9.worker.runtime.interface import ContainerSpec, Exit, Runtime, Started
from levers9.worker.sandboxes.sandboxes import Sandboxes, generation_refusal, is_function

from . import boxes
from .box_probe import probe as probe_box
from .idle import should_stop_idle
from .placement import Running, runner_env

log = logging.getLogger("levers9.worker")

MONITOR_EVERY_S = 1.0
HEALTH_POLL_S = 0.02
NOTHING_TO_RUN = "nothing to run: the request names no deployment"


def iso_utc(t: float) -> str:
    """A wall-clock time as the log writes times (ISO 8601, UTC); "" for 0 (not known)."""
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat().replace("+00:00", "Z") if t else ""


@dataclass(frozen=True)
class ContainerParts:
    """What the containers' lifecycle uses of its worker. The runtime, the bus (behind `publish`) and
    the drain flag are read at each use: the runtime is chosen when the worker starts, the bus and
    the pool exist once it is connected."""
    worker_id: str
    settings: Settings
    runtime: Callable[[], Runtime]
    publish: Callable[[Envelope], Awaitable[Any]]
    draining: Callable[[], Awaitable[bool]]  # whether the worker drains (read each monitor round)
    fetch_code: Callable[[Running], Awaitable[Path]]  # the placement's code, unpacked
    secrets: Callable[[Running, list[str]], Awaitable[dict[str, str]]]  # its secrets, opened
    checkpoints: Checkpoints
    sandboxes: Sandboxes
    volumes: WorkerVolumes
    gpus: NodeGpus
    sdk_dir: Path  # containers' /opt/levers9: the SDK alone


class Containers(Mapping[str, Running]):
    """The live containers of this worker (a read-only mapping) and what happens to them."""

    def __init__(self, parts: ContainerParts) -> None:
        self.parts = parts
        self._live: dict[str, Running] = {}
        self._stops: set[asyncio.Task[None]] = set()  # stop_soon's, awaited by stop_all

    def __getitem__(self, container_id: str) -> Running:
        return self._live[container_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._live)

    def __len__(self) -> int:
        return len(self._live)

    @property
    def runtime(self) -> Runtime:
        return self.parts.runtime()

    # ---- starting ------------------------------------------------------------------------------

    async def place(self, ev: E.ContainerScheduled, seq: int, env: Envelope) -> None:
        """A (fresh) placement on this worker at stream sequence `seq`: start the container in the
        background (the consumer goes on)."""
        c = Running(ev.container_id, env.workspace, ev.deployment_id, env.correlation_id, time.time(), spec=ev.spec,
                    deployment_version=ev.deployment_version, memory_mib=ev.resources.memory_mib,
                    scheduled_seq=seq, session_id=ev.session_id)
        if ev.spec is None:  # a bare container request, or a placement from before the spec travelled
            why = NOTHING_TO_RUN if not ev.deployment_id else \
                f"nothing to run: the placement of deployment {ev.deployment_id} carries no spec"
            await self.finish(c, Exit(None, why), failed=True)
            return
        refusal = generation_refusal(ev.spec) if is_function(ev.spec) else ""
        if boxes.box_of(ev.spec) is not None:  # a box's command runs in an isolated container or nowhere
            refusal = boxes.refusal(ev.spec, self.runtime.capabilities, self.runtime.name)
        if refusal:
            await self.finish(c, Exit(None, refusal), failed=True)
            return
        self._live[c.container_id] = c
        c.task = spawn(self.start(c, ev), name=f"start {c.container_id}", logger=log)

    async def start(self, c: Running, ev: E.ContainerScheduled) -> None:
        assert c.spec is not None
        p = self.parts
        box = boxes.box_of(c.spec)
        try:
            code_dir = await p.fetch_code(c)
            secrets = await self.secret_env(c.container_id, c.spec.secrets)
            env = boxes.box_env(c.spec, secrets, container_id=c.container_id, deployment_id=c.deployment_id) \
                if box else runner_env(c.spec, secrets, container_id=c.container_id, deployment_id=c.deployment_id,
                                       max_body_bytes=p.settings.gateway.max_body_bytes)
            cspec = ContainerSpec(container_id=c.container_id, code_dir=code_dir,
                                  sdk_dir=p.sdk_dir, env=env, **(boxes.container_fields(box) if box else {}),
                                  cpu_millicores=ev.resources.cpu_millicores, memory_mib=ev.resources.memory_mib,
                                  image=c.spec.image_ref, workspace=c.workspace, deployment_id=c.deployment_id,
                                  binds=await p.volumes.binds(c.workspace, c.container_id, c.spec, self.runtime),
                                  **p.gpus.take(c.container_id, c.spec),
                                  **(p.sandboxes.container_fields(c.container_id, c.workspace, c.spec.image_ref)
                                     if is_function(c.spec) else {}))
        except Exception as exc:  # noqa: BLE001 - every failure becomes ContainerFailed with its reason
            log.exception("container %s could not start", c.container_id)
            await self.finish(c, Exit(None, f"could not start: {type(exc).__name__}: {exc}"), failed=True)
            return
        try:
            if cspec.packages_dir is not None:
                await p.sandboxes.preinstall(cspec, c.spec, self.runtime)
        except Exception as exc:  # noqa: BLE001 - the call that asked for the sandbox gets why
            await self.finish(c, Exit(None, f"could not start: {exc}"), failed=True)
            return
        note = ""
        if ev.checkpoint is not None and not c.stopping:
            started, note = await p.checkpoints.restore(c, cspec, ev.checkpoint)
            if started is not None:
                c.restored_from = ev.checkpoint.checkpoint_id
                await self.started(c, started, note)
                return
        if c.stopping:  # stopped while its code was fetched: start nothing
            return
        try:
            started = await self.runtime.start(cspec)
        except Exception as exc:  # noqa: BLE001 - every failure becomes ContainerFailed with its reason
            log.exception("container %s could not start", c.container_id)
            await self.finish(c, Exit(None, f"could not start: {type(exc).__name__}: {exc}"), failed=True)
            return
        await self.started(c, started, note or p.gpus.cold_note(c.spec))

    async def started(self, c: Running, started: Started, note: str) -> None:
        assert c.spec is not None
        if c.stopping:  # stopped (and reported) while it started: its stop found nothing to stop yet
            await self.runtime.stop(c.container_id)
            return
        await self.emit(c, E.ContainerStarted(container_id=c.container_id, worker_id=self.parts.worker_id,
                                              restored_from=c.restored_from, note=note,
                                              root_mounted_at=iso_utc(started.root_mounted_at)))
        await self.wait_ready(c, started.address, float(c.spec.timeout_seconds))

    async def wait_ready(self, c: Running, address: str, timeout: float) -> None:
        """Poll until the container is ready (the runner's health, or a box's port), it ended, or
        its start timeout passed; each outcome is an event."""
        patience = max(timeout, 30.0)
        deadline = time.monotonic() + patience
        box = boxes.box_of(c.spec)
        last: boxes.Probe | None = None
        # to the container's own address only: no proxy from the worker's environment, no redirect
        async with httpx.AsyncClient(timeout=2.0, trust_env=False, follow_redirects=False) as client:
            while time.monotonic() < deadline and not c.stopping:
                ended = await self.runtime.poll(c.container_id)
                if ended is not None:
                    await self.finish(c, boxes.ended(box, ended, was_ready=False) if box else ended, failed=True)
                    return
                if box is not None:
                    last = await probe_box(client, address, box)
                    is_ready, failure = boxes.ready(box, last), ""
                else:
                    is_ready, failure = await runner_health(client, address)
                if is_ready:
                    await self.ready(c, address)
                    return
                if failure:
                    await self.stop(c, failure, failed=True)
                    return
                await asyncio.sleep(HEALTH_POLL_S)
        if not c.stopping:
            await self.stop(c, boxes.not_ready(box, patience, last) if box else f"not ready within {timeout:.0f} s",
                            failed=True)

    async def ready(self, c: Running, address: str) -> None:
        """ContainerReady with where the gateway reaches it; then its dump, when the policy says so."""
        published = await self.sandbox_address(c, address)
        if not published:
            return
        c.address, c.ready_at = address, time.time()
        await self.emit(c, E.ContainerReady(container_id=c.container_id, worker_id=self.parts.worker_id,
                                            address=published))
        self.parts.checkpoints.after_ready(c)

    async def sandbox_address(self, c: Running, address: str) -> str:
        """Where the gateway reaches a ready container: its own address, or for a function sandbox
        the relay's once the executor answered ("" when it failed and was stopped)."""
        if not is_function(c.spec):
            return address
        try:
            return await self.parts.sandboxes.ready_address(c.container_id)
        except Exception as exc:  # noqa: BLE001 - a sandbox without a working executor fails with why
            await self.stop(c, f"the executor did not start: {type(exc).__name__}: {exc}", failed=True)
            return ""

    async def secret_env(self, container_id: str, names: list[str]) -> dict[str, str]:
        """A placed container's secrets: opened here with the keyring, or by the gateway (secret_source)."""
        return await self.parts.secrets(self._live[container_id], names)

    # ---- stopping ------------------------------------------------------------------------------

    async def stop(self, c: Running, reason: str, failed: bool = False, checkpoint_first: bool = False) -> None:
        """Stop `c` and report it; `checkpoint_first`: dump it before (a box with idle_checkpoint
        scaled in or drained: its next start restores it as it is now)."""
        if c.stopping:
            return
        c.stopping = True
        if checkpoint_first and c.ready_at is not None and idle_checkpoint(c.spec):
            await self.parts.checkpoints.before_stop(c)
        try:
            ended = await self.runtime.stop(c.container_id)
        except Exception as exc:  # noqa: BLE001 - the stop is reported with why it failed
            ended = Exit(None, f"stop failed: {exc}")
        if ended.oom:
            reason, failed = ended.reason, True
        await self.finish(c, Exit(ended.code, reason, ended.oom), failed=failed)

    def stop_soon(self, c: Running, reason: str, checkpoint_first: bool = False) -> None:
        """Stop `c` in the background: the worker's container events are handled one at a time, and
        a placement waited behind each stop (runc's kill, the teardown; a notebook's dump): ~270 ms
        of every sandbox created right after another was terminated. A crash before it ends leaves
        the container to the next start's reaper, as any crash does."""
        task = spawn(self.stop(c, reason, checkpoint_first=checkpoint_first), name=f"stop {c.container_id}",
                     logger=log)
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def stop_all(self, reason: str) -> None:
        for c in list(self._live.values()):
            await self.stop(c, reason)
        if self._stops:  # the stops already under way end before the worker does
            await asyncio.gather(*set(self._stops), return_exceptions=True)

    async def finish(self, c: Running, ended: Exit, failed: bool) -> None:
        p = self.parts
        self._live.pop(c.container_id, None)
        p.sandboxes.forget(c.container_id)
        p.gpus.free(c.container_id)  # its cards, once it is stopped
        if failed:
            tail = self.runtime.log_tail(c.container_id)
            reason = ended.reason + (f"; log: {tail}" if tail and tail not in ended.reason else "")
            if not c.stopping:
                try:
                    await self.runtime.stop(c.container_id)
                except Exception:  # noqa: BLE001 - best effort cleanup; the failure is reported below
                    log.exception("cleaning up the failed container %s", c.container_id)
            await self.emit(c, E.ContainerFailed(container_id=c.container_id, worker_id=p.worker_id,
                                                 exit_code=ended.code, reason=reason))
        else:
            await self.emit(c, E.ContainerStopped(container_id=c.container_id, worker_id=p.worker_id,
                                                  exit_code=ended.code or 0, reason=ended.reason))
        await p.volumes.release(c.container_id)  # its buckets, once it is stopped

    async def emit(self, c: Running, event: E.Event) -> None:
        await self.parts.publish(envelope(event, workspace=c.workspace, correlation_id=c.correlation_id))

    # ---- watching ------------------------------------------------------------------------------

    async def monitor(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=1.0) as client:
            while not stop.is_set():
                await sleep_unless_stopped(stop, MONITOR_EVERY_S)
                draining = await self.parts.draining()
                for c in list(self._live.values()):
                    if c.stopping or c.ready_at is None or c.deployment_id in self.parts.checkpoints.dumping:
                        continue  # never stop a container in the middle of its dump
                    try:
                        await self.check(client, c, draining)
                    except Exception:  # noqa: BLE001 - next round checks again
                        log.exception("checking %s failed", c.container_id)

    async def check(self, client: httpx.AsyncClient, c: Running, draining: bool) -> None:
        assert c.ready_at is not None
        ended = await self.runtime.poll(c.container_id)
        if ended is not None:
            box = boxes.box_of(c.spec)
            await self.finish(c, boxes.ended(box, ended, was_ready=True) if box else ended, failed=True)
            return
        if draining:
            await self.stop(c, f"worker {self.parts.worker_id} drained", checkpoint_first=True)
            return
        if autoscaled(c):
            return  # the scheduler's autoscaler stops these (ContainerStopRequested with its reason)
        try:
            status = (await client.get(f"{c.address}/_levers9/status")).json()
        except (httpx.HTTPError, ValueError):
            return
        why = should_stop_idle(time.time(), c.ready_at, status.get("last_request_at"), status.get("inflight", 0),
                               c.keep_warm_seconds)
        if why:
            await self.stop(c, why)


def autoscaled(c: Running) -> bool:
    """Whether the scheduler's autoscaler stops this container when idle, not the worker's keep-warm:
    its deployment is governed, and it is not a session's sandbox (one caller's own, of the same
    deployment: the autoscaler skips it)."""
    return governed(c.spec) and not c.session_id


async def runner_health(client: httpx.AsyncClient, address: str) -> tuple[bool, str]:
    """(ready, why it failed) from the runner's health: 200 ready, 500 failed at import or on_start,
    anything else (or no answer yet) neither."""
    try:
        r = await client.get(f"{address}/_levers9/health")
    except httpx.HTTPError:
        return False, ""
    if r.status_code == 500:
        return False, f"app failed to start: {_json(r).get('error', 'the app failed to start')}"
    return r.status_code == 200, ""


def _json(r: httpx.Response) -> dict[str, Any]:
    try:
        body = r.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less when `stop` is set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass
