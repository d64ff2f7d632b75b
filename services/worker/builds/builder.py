"""Image builds on a worker of the build pool: one ImageBuildStarted in, layers and an image pushed to
the registry, ImageBuildProgress as it goes and ImagePushed (or ImageBuildFailed) at the end.

A build starts from the deepest step the layer cache holds (`cached_steps`, decided by the
image-builder) and runs each remaining step in its own working container on top of the previous
step's image, so every step is one layer that later builds reuse:

    buildah from <registry>/levers9/cache:<hash of step k-1>   (or the base)
    buildah run --network ns:<its own> … -- <the step's argv>   (output streamed as log events)
    buildah commit → localhost/levers9/cache:<hash>, pushed to <registry>/levers9/cache:<hash>
    … and at the end: buildah config --env, commit and push levers9/images:<image id>

The platform base (PLATFORM_BASE) is made once per registry from the worker's base root fs; a
user's base image is pulled as named. pip inside a step sees the host's pip configuration (config
files, local wheel dirs and file:// indexes, certificates, PIP_* variables), bound read-only: builds
install from wherever this machine's pip installs from, and no host name is written anywhere.

A step is tenant code: it runs in a network namespace of its own on the worker's bridge, firewalled
like a container, whose one way out is the worker's egress proxy to the package indexes
(levers9.worker.network.egress_proxy: `lane`, and the HTTP(S)_PROXY variables of `env`); never the host's
network, so never the control plane's ports. Its only host mounts are the pip ones above.

Pure parts (tested alone): a step's argv (step_argv), log batching (Batcher), which mount points a
run creates (missing_chain); which host paths pip needs is buildah.pip_mounts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import AsyncContextManager, Awaitable, Callable, Literal, Protocol

from levers9.contracts import Envelope, envelope
from levers9.contracts import events as E
from levers9.contracts.images import PLATFORM_BASE, BuildStep, env_list, image_tag
from levers9.contracts.subjects import filter_subject
from levers9.runtime.bus import Bus
from levers9.runtime.consumer import Delivery, WorkConsumer
from levers9.runtime.off_loop import scratch_dir
from levers9.worker.runtime.runc import rootfs

from . import buildah
from .buildah import Mount, ToolError, host_pip_mounts

log = logging.getLogger("levers9.worker.builds.builder")

STEP_TIMEOUT_S = 3600.0  # a step that runs longer is killed and fails the build
LOG_EVERY_S = 0.5  # log lines go out at least this often while a step prints ...
LOG_LINES = 50  # ... or as soon as this many are waiting
TAIL_LINES = 30  # the failing step's last lines, in ImageBuildFailed.log_tail
BASE_STAMP_LABEL = "levers9.rootfs"  # which base root fs (inode, mtime) a local base image was made from
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # from scratch has none

# ---- pure: steps as commands, log batching, mount points ---------------------------------------------

APT_SCRIPT = ('apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"'
              ' && rm -rf /var/lib/apt/lists/*')


def step_argv(step: BuildStep) -> list[str]:
    """What `buildah run` runs for a step. Package names are arguments, never shell text: the apt
    script takes them as "$@"."""
    if step.kind == "apt":
        return ["sh", "-c", APT_SCRIPT, "sh", *step.args]
    if step.kind == "pip":
        return ["python3", "-m", "pip", "install", "--no-cache-dir", "--root-user-action=ignore", *step.args]
    if step.kind == "run":
        return ["sh", "-c", step.args[0]]
    raise ValueError(f"step {step.index} is a {step.kind} step: it is pulled, not run")


def step_label(step: BuildStep, total: int) -> str:
    return f"step {step.index + 1}/{total}"


@dataclass
class Batcher:
    """Collects a step's output lines and says when a batch should go out: LOG_LINES lines, or the
    oldest waiting line is LOG_EVERY_S old."""
    max_lines: int = LOG_LINES
    max_wait: float = LOG_EVERY_S
    lines: list[str] = field(default_factory=list)
    first_at: float = 0.0

    def add(self, line: str, now: float) -> list[str]:
        if not self.lines:
            self.first_at = now
        self.lines.append(line)
        return self.take() if len(self.lines) >= self.max_lines else []

    def due(self, now: float) -> list[str]:
        return self.take() if self.lines and now - self.first_at >= self.max_wait else []

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


def missing_chain(target: str, exists: Callable[[str], bool]) -> list[str]:
    """The ancestors of `target` (itself included) that do not exist, outermost first: what a bind
    mount there creates in the container's root, to be removed before the commit."""
    chain = []
    path = PurePosixPath(target)
    while str(path) != "/" and not exists(str(path)):
        chain.append(str(path))
        path = path.parent
    return chain[::-1]


# ---- the build (imperative) ------------------------------------------------------------------------

Emit = Callable[[E.Event], Awaitable[object]]
State = Literal["cached", "running", "log", "done", "failed", "pushing"]


class Lanes(Protocol):
    """Where a step's network comes from (levers9.worker.network.egress_proxy.Egress)."""

    def lane(self, owner: str) -> AsyncContextManager[Path]: ...

    def env(self) -> dict[str, str]: ...


@dataclass
class BuildHost:
    """What a build needs of the worker it runs on."""
    registry: str  # host:port
    image_cache: Path  # where the base root fs lives (settings.image_cache)
    builder: str  # this worker's id
    emit: Emit  # appends an event (in the build's workspace, correlated with its start)
    lanes: Lanes  # each step's own network namespace, and the proxy variables
    pip: tuple[list[Mount], list[str]] = field(default_factory=host_pip_mounts)


class StepFailed(Exception):
    def __init__(self, step: int, reason: str) -> None:
        super().__init__(reason)
        self.step, self.reason = step, reason


async def run_build(started: E.ImageBuildStarted, host: BuildHost) -> E.ImagePushed | E.ImageBuildFailed:
    """Build, push and report one image; the final event is appended and returned. The working
    container is removed whatever happens; a cancelled build (worker stopping) is reported failed."""
    build = Build(started, host)
    result: E.ImagePushed | E.ImageBuildFailed
    try:
        result = await build.run()
    except StepFailed as exc:
        result = build.failed(exc.reason, exc.step)
    except asyncio.CancelledError:
        await host.emit(build.failed(f"build worker {host.builder} stopped during the build", build.step))
        raise
    except Exception as exc:  # noqa: BLE001 - any failure ends the build with its reason
        log.exception("build of %s failed", started.image_id)
        result = build.failed(f"{type(exc).__name__}: {exc}", -1)
    finally:
        await asyncio.shield(buildah.remove(build.container))
    await host.emit(result)
    return result


class Build:
    """One build's state: its working container, the step in hand and that step's output."""

    def __init__(self, started: E.ImageBuildStarted, host: BuildHost) -> None:
        self.started, self.host = started, host
        self.steps, self.total = started.steps, len(started.steps)
        self.container = f"levers9-build-{started.image_id}"
        self.step = -1
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.batch = Batcher()

    def failed(self, reason: str, step: int) -> E.ImageBuildFailed:
        return E.ImageBuildFailed(image_id=self.started.image_id, reason=reason, step=step,
                                  log_tail=list(self.tail))

    async def progress(self, step: int, state: State, lines: list[str] | None = None, seconds: float = 0.0) -> None:
        await self.host.emit(E.ImageBuildProgress(image_id=self.started.image_id, builder=self.host.builder,
                                                  step=step, total=self.total, state=state,
                                                  lines=lines or [], seconds=round(seconds, 3)))

    def remote(self, reference: str) -> str:
        return f"{self.host.registry}/{reference}"

    async def run(self) -> E.ImagePushed:
        if not self.host.registry:
            raise RuntimeError("no registry to push to: LEVERS9_REGISTRY is not set on this worker")
        base = await self.ensure_base()
        cached = max(0, min(self.started.cached_steps, self.total))
        await self.start_from(base, cached)
        for step in self.steps[max(cached, 1):]:
            await self.run_step(step)
        return await self.finish()

    async def start_from(self, base: str, cached: int) -> None:
        """The working container on the deepest cached step (or the base); steps before it are
        reported cached. A cache tag gone from the registry means building from the base again."""
        if cached >= 2:
            try:
                await buildah.from_image(self.remote(self.steps[cached - 1].cache_tag), self.container)
            except ToolError as exc:
                log.warning("cache tag of step %d is not usable (%s); building from the base", cached - 1, exc)
                cached = 0
        if cached < 2:
            await buildah.from_image(base, self.container)
        for step in self.steps[:cached]:
            await self.progress(step.index, "cached", [f"{step_label(step, self.total)} cached "
                                                       f"(layer {step.hash[:12]}): {step.text}"])
        if cached == 0:  # the base is the first layer: tag it as step 0's cache too
            began = time.monotonic()
            self.step = 0
            await self.progress(0, "running", [f"{step_label(self.steps[0], self.total)} {self.steps[0].text}"])
            await self.push(base, self.steps[0].cache_tag)
            await self.progress(0, "done", seconds=time.monotonic() - began)

    async def run_step(self, step: BuildStep) -> None:
        self.step, began = step.index, time.monotonic()
        self.tail.clear()
        await self.progress(step.index, "running", [f"{step_label(step, self.total)} {step.text}"])
        mounts, pip_vars = self.host.pip if step.kind != "apt" else ([], [])  # apt needs no pip; its
        # certificates must stay writable (update-ca-certificates)
        created = await self.mount_points(mounts) if mounts else None
        ticker = asyncio.create_task(self.tick(step.index))
        try:
            async with self.host.lanes.lane(f"{self.container}-{step.index}") as netns:
                proxy = [f"{k}={v}" for k, v in self.host.lanes.env().items()]  # last: ours win
                code = await buildah.run(self.container, step_argv(step), netns=netns,
                                         env=env_list(self.started.blueprint) + pip_vars + proxy, mounts=mounts,
                                         on_line=lambda line: self.line(step.index, line), timeout=STEP_TIMEOUT_S)
        finally:
            ticker.cancel()
            await self.flush(step.index)
        if created is not None:
            await self.remove_mount_points(created)
        if code != 0:
            why = f"timed out after {STEP_TIMEOUT_S:.0f} s" if code == -9 else f"exited {code}"
            await self.progress(step.index, "failed", [why], time.monotonic() - began)
            raise StepFailed(step.index, f"{step_label(step, self.total)} `{step.text}` {why}")
        local = f"localhost/{step.cache_tag}"
        await buildah.commit(self.container, local)
        await self.push(local, step.cache_tag)
        await buildah.from_image(local, self.container)  # the next step is a layer on top of this one
        await self.progress(step.index, "done", seconds=time.monotonic() - began)

    async def finish(self) -> E.ImagePushed:
        started = self.started
        self.step = self.total - 1  # the final push is reported under the last step
        await buildah.set_env(self.container, env_list(started.blueprint))
        local = f"localhost/{image_tag(started.image_id)}"
        await buildah.commit(self.container, local)
        digest = await self.push(local, image_tag(started.image_id))
        return E.ImagePushed(image_id=started.image_id, builder=self.host.builder, registry=self.host.registry,
                             reference=image_tag(started.image_id), digest=digest,
                             step_hashes=[s.hash for s in self.steps])

    async def push(self, local: str, reference: str) -> str:
        await self.progress(max(self.step, 0), "pushing", [f"pushing {reference}"])
        async with scratch_dir("levers9-push-") as tmp:
            return await buildah.push(local, self.remote(reference), tmp / "digest")

    # ---- output -------------------------------------------------------------------------------------

    async def line(self, step: int, text: str) -> None:
        self.tail.append(text)
        lines = self.batch.add(text, time.monotonic())
        if lines:
            await self.progress(step, "log", lines)

    async def tick(self, step: int) -> None:
        while True:
            await asyncio.sleep(LOG_EVERY_S / 5)
            lines = self.batch.due(time.monotonic())
            if lines:
                await self.progress(step, "log", lines)

    async def flush(self, step: int) -> None:
        lines = self.batch.take()
        if lines:
            await self.progress(step, "log", lines)

    # ---- mount points a run would leave in the layer ------------------------------------------------

    async def mount_points(self, mounts: list[Mount]) -> list[Path]:
        """Paths a run's bind mounts will create in the container's root (buildah leaves them behind
        as empty files and dirs), innermost first, to remove before the commit."""
        root = await buildah.mount(self.container)
        created: list[Path] = []
        for m in mounts:
            chain = missing_chain(m.target, lambda p: os.path.lexists(root / p.lstrip("/")))
            created += [root / p.lstrip("/") for p in reversed(chain)]
        return created

    async def remove_mount_points(self, created: list[Path]) -> None:
        for path in created:  # only what is still empty: never what the step itself put there
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                elif path.is_file() and path.stat().st_size == 0:
                    path.unlink()
        await buildah.umount(self.container)

    # ---- the base -----------------------------------------------------------------------------------

    async def ensure_base(self) -> str:
        """The reference the first layer comes from: a user's base image as named, or the platform
        base in our registry, made there first if it is not (once: a file lock across workers)."""
        named = self.steps[0].args[0]
        if named != PLATFORM_BASE:
            return named
        reference = self.remote(PLATFORM_BASE)
        if await buildah.exists_remote(reference):
            return reference
        lock_path = Path(self.host.image_cache) / "registry-base.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "w") as lock:
            await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
            if not await buildah.exists_remote(reference):
                await self.push_platform_base(reference)
        return reference

    async def push_platform_base(self, reference: str) -> None:
        began = time.monotonic()
        await self.progress(0, "log", [f"making the platform base {PLATFORM_BASE} (once per registry)"])
        root = await asyncio.to_thread(rootfs.ensure_base_rootfs, Path(self.host.image_cache),
                                       lambda msg: log.info("base root fs: %s", msg))
        stat = root.stat()
        stamp = f"{stat.st_ino}-{stat.st_mtime_ns}"
        local = f"localhost/{PLATFORM_BASE}"
        labels = await buildah.image_labels(local)
        if labels is None or labels.get(BASE_STAMP_LABEL) != stamp:  # no local copy of this root fs yet
            name = f"{self.container}-base"
            await buildah.from_scratch(name)
            try:
                await buildah.copy_tree(root, await buildah.mount(name))
                await buildah.umount(name)
                await buildah.set_env(name, [PATH_ENV])
                await buildah.add_label(name, BASE_STAMP_LABEL, stamp)
                await buildah.commit(name, local)
            finally:
                await buildah.remove(name)
        async with scratch_dir("levers9-push-") as tmp:
            await buildah.push(local, reference, tmp / "digest")
        log.info("platform base pushed to %s in %.1f s", reference, time.monotonic() - began)
        await self.progress(0, "log", [f"platform base pushed in {time.monotonic() - began:.1f} s"])


# ---- the build consumer of a build-pool worker ------------------------------------------------------

class Builds:
    """A build worker's builds: consumes every ImageBuildStarted (any workspace), acts on those given
    to this worker, one build at a time in the order they came; the consumer never waits on a build.
    A redelivered start of a build already taken here is ignored."""

    def __init__(self, worker_id: str, registry: str, image_cache: Path,
                 publish: Callable[[Envelope], Awaitable[object]], lanes: Lanes) -> None:
        self.worker_id, self.registry, self.image_cache = worker_id, registry, image_cache
        self.publish, self.lanes = publish, lanes
        self.turn = asyncio.Lock()  # fair: builds run in the order they were taken
        self.taken: set[tuple[str, int]] = set()
        self.tasks: set[asyncio.Task] = set()
        self.current = ""
        self.finished = 0

    def consumer(self, bus: Bus) -> WorkConsumer:
        """Its own durable per worker (the worker's placement consumer keeps its filters)."""
        return WorkConsumer(bus, f"worker-{self.worker_id}-builds",
                            [filter_subject(aggregate="image", event_type="ImageBuildStarted")],
                            handle=self.on_event, max_deliver=50, ack_wait=60)

    async def on_event(self, d: Delivery) -> None:
        """A build given to this worker is queued; the consumer goes on (a build takes minutes)."""
        assert d.message is not None  # undecodable deliveries are dead-lettered before the handler
        event = d.message.event
        if isinstance(event, E.ImageBuildStarted) and self.wants(event):
            self.take(event, d.message.envelope)

    def wants(self, event: E.Event) -> bool:
        return (isinstance(event, E.ImageBuildStarted) and event.builder == self.worker_id
                and (event.image_id, event.attempt) not in self.taken)

    def take(self, event: E.ImageBuildStarted, start: Envelope) -> asyncio.Task:
        """Queue the build (a task); returns at once."""
        self.taken.add((event.image_id, event.attempt))
        task = asyncio.create_task(self.build(event, start), name=f"build {event.image_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def build(self, event: E.ImageBuildStarted, start: Envelope) -> E.Event:
        async def emit(e: E.Event) -> object:  # in the build's workspace, caused by its start
            return await self.publish(envelope(e, workspace=start.workspace, correlation_id=start.correlation_id,
                                               causation_id=start.id))
        try:
            await self.turn.acquire()
        except asyncio.CancelledError:
            await emit(E.ImageBuildFailed(image_id=event.image_id, reason=f"build worker {self.worker_id} "
                                                                         "stopped before the build began"))
            raise
        try:
            self.current = event.image_id
            host = BuildHost(registry=self.registry, image_cache=self.image_cache, builder=self.worker_id,
                             emit=emit, lanes=self.lanes)
            result = await run_build(event, host)
            log.info("build of %s: %s", event.image_id, type(result).__name__)
            return result
        finally:
            self.current = ""
            self.finished += 1
            self.turn.release()

    async def stop(self) -> None:
        """Cancel the builds in hand and queued (each reports itself failed and cleans up)."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
