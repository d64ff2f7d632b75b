"""Which shared pre-import checkpoints this worker can restore, announced (WorkerCatalogueChecked).

A checkpoint captured with other sandbox settings than this worker's (network mode, overlay, lazy
image, GPU, CPU features it lacks, Python) may fail to restore or misbehave after it: by default
(`worker_shared_checkpoints = "drop"`) it is dropped and the announcement says why; "keep" announces
it anyway, "off" announces none. A worker without CRIU announces none. A checkpoint whose executor
speaks a generation this worker does not implement is dropped whatever the setting.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from levers9.catalogue.in_sandbox import cpu_features
from levers9.contracts import SYSTEM_WORKSPACE, envelope, subjects
from levers9.contracts import events as E
from levers9.contracts.catalogue import Catalogue, SandboxSettings
from levers9.contracts.checkpoint_choice import settings_mismatch
from levers9.contracts.spec import CheckpointRef
from levers9.executor import wire
from levers9.runtime.catalogues import fetch
from levers9.runtime.config import Settings
from levers9.runtime.consumer import Delivery, WorkConsumer
from levers9.runtime.tasks import spawn

log = logging.getLogger("levers9.worker.sandboxes.catalogue_check")

def my_settings(settings: Settings, runtime: str) -> SandboxSettings:
    try:
        with open("/proc/cpuinfo") as f:
            features = cpu_features(f.read())
    except OSError:
        features = []
    runc = runtime == "runc"
    return SandboxSettings(network_mode="bridge" if runc else "host", overlay=runc, lazy_image=runc, gpu="",
                           cpu_features=features, python=settings.functions.sandbox_python)


def check(cat: Catalogue, mine: SandboxSettings, mode: str, can_restore: bool) -> tuple[list[str], dict[str, str]]:
    """(restorable ids, dropped id -> why) of a catalogue on this worker (pure)."""
    restorable: list[str] = []
    dropped: dict[str, str] = {}
    for c in cat.checkpoints:
        why = ""
        if not can_restore or mode == "off":
            why = "this worker cannot restore checkpoints (no CRIU)" if not can_restore else \
                "shared checkpoints are off on this worker (worker_shared_checkpoints = \"off\")"
        elif c.executor_generation not in wire.SUPPORTED_GENERATIONS:
            why = f"its executor speaks generation {c.executor_generation}; this worker implements " \
                  f"{sorted(wire.SUPPORTED_GENERATIONS)}"
        elif mode != "keep":
            why = settings_mismatch(c.settings, mine)
        if why:
            dropped[c.checkpoint_id] = why
        else:
            restorable.append(c.checkpoint_id)
    return restorable, dropped


class CatalogueCheck:
    def __init__(self, worker_id: str, settings: Settings, publish: Callable[[Any], Awaitable[Any]],
                 runtime: Callable[[], tuple[str, bool]], ready: asyncio.Event,
                 warm: Callable[[CheckpointRef], Awaitable[None]] | None = None) -> None:
        self.warm = warm  # fetch and unpack a checkpoint ahead of its first restore
        self.ready = ready  # registered: its runtime prepared, CRIU checked
        self.worker_id = worker_id
        self.settings = settings
        self.publish = publish
        self.runtime = runtime  # (its name, whether it can restore)

    async def announce(self, cat: Catalogue) -> None:
        name, can_restore = self.runtime()
        restorable, dropped = check(cat, my_settings(self.settings, name), self.settings.functions.shared_checkpoints,
                                    can_restore)
        for cid, why in dropped.items():
            log.warning("shared checkpoint %s of catalogue %s dropped: %s", cid, cat.catalogue_id, why)
        await self.publish(envelope(E.WorkerCatalogueChecked(
            worker_id=self.worker_id, catalogue_id=cat.catalogue_id, restorable=restorable, dropped=dropped),
            workspace=SYSTEM_WORKSPACE))
        if self.warm is not None:  # in the background: the announcement is acked meanwhile
            refs = [c.ref for c in cat.checkpoints if c.checkpoint_id in restorable and c.ref is not None]
            spawn(self._warm_all(refs), name=f"warm catalogue {cat.catalogue_id}", logger=log)

    async def _warm_all(self, refs: list[CheckpointRef]) -> None:
        assert self.warm is not None
        for ref in refs:
            await self.warm(ref)

    def consumer(self, bus: Any) -> WorkConsumer:
        async def handle(d: Delivery) -> None:
            assert d.message is not None
            ev = d.message.event
            if isinstance(ev, E.CatalogueBuilt):
                await self.ready.wait()
                await self.announce(await fetch(self.settings, ev.bucket, ev.key))

        return WorkConsumer(bus, f"worker-{self.worker_id}-catalogues",
                            [subjects.filter_subject(aggregate="catalogue", event_type="CatalogueBuilt")],
                            handle=handle, max_deliver=20, ack_wait=60)
