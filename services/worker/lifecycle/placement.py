"""What the worker makes of a delivered placement (pure): the container it runs, its environment,
and whether the placement is stale.

The worker starts a container from the ContainerScheduled alone (it carries the spec, the
resources reserved and the checkpoint to restore); it reads no projection to start it.

Staleness without a projection: the worker's own consumer delivers, in stream order, every
ContainerScheduled (of every worker) and every ContainerStopRequested. `Overtaken` remembers, per
container, the latest stream sequence at which this worker saw the container move on: a stop
requested, a placement on another worker, or this very placement handled here already. A
placement delivered at or before that sequence (a redelivery, a nak'd message coming back after
later ones) is stale. What a fresh worker process has not seen it cannot know: a placement
redelivered after a crash of the worker is not recognised (the previous run's containers are gone
then anyway: cleanup_all removed them).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

from levers9.contracts.spec import DeploymentSpec

OVERTAKEN_REMEMBERED = 10_000  # containers; the oldest are forgotten first


@dataclass
class Running:
    """A container this worker started (or is starting), as the worker tracks it."""
    container_id: str
    workspace: str
    deployment_id: str
    correlation_id: str
    started_at: float
    spec: DeploymentSpec | None = field(default=None, repr=False)
    deployment_version: int = 0
    memory_mib: int = 0
    scheduled_seq: int = 0  # the stream sequence of the ContainerScheduled it runs for
    address: str = ""
    ready_at: float | None = None
    stopping: bool = False
    restored_from: str = ""
    session_id: str = ""  # the function session it is for alone (ContainerScheduled.session_id), "" for none
    task: asyncio.Task | None = field(default=None, repr=False)

    @property
    def keep_warm_seconds(self) -> int:
        return self.spec.scaling.window if self.spec else 0


def runner_env(spec: DeploymentSpec, secrets: dict[str, str], *, container_id: str, deployment_id: str,
               max_body_bytes: int) -> dict[str, str]:
    """The container's environment: its image's env (the archive holds files, not the image's
    config), the spec's env over it, its secrets over that, then what the runner reads (the
    runner's own settings win over all)."""
    code = spec.code
    image_env = spec.image.env if spec.image else {}
    return {**image_env, **spec.env, **secrets,
            "LEVERS9_RUNNER_MODULE": code.module, "LEVERS9_RUNNER_HANDLER": code.handler,
            "LEVERS9_RUNNER_KIND": code.kind, "LEVERS9_RUNNER_ON_START": code.on_start,
            "LEVERS9_RUNNER_CONCURRENCY": str(spec.scaling.concurrency),
            "LEVERS9_RUNNER_TIMEOUT": str(spec.timeout_seconds),
            "LEVERS9_RUNNER_MAX_BODY": str(max_body_bytes),
            "LEVERS9_CONTAINER_ID": container_id, "LEVERS9_DEPLOYMENT_ID": deployment_id,
            **({"LEVERS9_RUNNER_IMPORTS": ",".join(spec.function.preload)} if spec.function and spec.function.preload
               else {})}


class Overtaken:
    """Per container, the latest stream sequence at which it moved on, and how (bounded)."""

    def __init__(self, limit: int = OVERTAKEN_REMEMBERED) -> None:
        self.limit = limit
        self._seen: OrderedDict[str, tuple[int, str]] = OrderedDict()

    def saw(self, container_id: str, seq: int, how: str) -> None:
        """Container `container_id` moved on at stream sequence `seq` (`how`, a phrase)."""
        if seq < self._seen.get(container_id, (0, ""))[0]:
            return
        self._seen[container_id] = (seq, how)
        self._seen.move_to_end(container_id)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def stale(self, container_id: str, placement_seq: int) -> str | None:
        """Why the placement delivered at `placement_seq` is stale, or None when it is not."""
        seq, how = self._seen.get(container_id, (0, ""))
        if seq and seq >= placement_seq:
            return f"{how} (stream sequence {seq})"
        return None

    def __len__(self) -> int:
        return len(self._seen)
