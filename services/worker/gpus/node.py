"""The GPUs of this worker's node as the worker service uses them: the inventory found at
registration, the CDI spec written once, the cards each container holds, whether GPU containers may
be checkpointed. The decisions are pure (levers9.worker.gpus.cards, levers9.worker.gpus.cdi, levers9.worker.checkpoints.gpu); this is the shell.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from levers9.contracts.spec import DeploymentSpec
from levers9.runtime.config import Settings
from levers9.worker.checkpoints.gpu import criu_cuda_plugin, cuda_checkpoint_binary, gpu_checkpoint

from . import cdi
from .cards import DETECTED, CardLedger, GpuGrant, Inventory, choose_inventory, read_nvml

log = logging.getLogger("levers9.worker.gpus.node")


class NodeGpus:
    def __init__(self, settings: Settings, state_dir: Path) -> None:
        self.settings, self.state_dir = settings, state_dir
        self.inventory = Inventory("", "")
        self.ledger = CardLedger(())
        self.cdi_spec: dict[str, Any] | None = None
        self.cdi_note = "no GPUs"
        self.checkpoints = (False, "no GPUs")

    async def register(self) -> dict[str, Any]:
        """Find the inventory (NVML, else the pool's configuration), write the CDI spec once when the
        cards are real, decide on GPU checkpoints; the WorkerRegistered fields of the GPUs."""
        s = self.settings
        inv = self.inventory = choose_inventory(await asyncio.to_thread(read_nvml), s.worker.gpu_type,
                                                s.worker.gpu_count)
        self.ledger = CardLedger(tuple(c.device_id for c in inv.cards))
        if inv.note:
            log.warning("GPUs: %s", inv.note)
        if inv.source == DETECTED and inv.cards:
            self.cdi_spec, self.cdi_note = await asyncio.to_thread(cdi.generate, self.state_dir / "cdi" / "nvidia.json")
        elif inv.cards:
            self.cdi_note = "configured inventory (no NVIDIA driver here): NVIDIA_VISIBLE_DEVICES only, no CDI edits"
        self.checkpoints = gpu_checkpoint(inv.driver, cuda_checkpoint_binary() is not None,
                                          criu_cuda_plugin(Path(s.images.image_cache)) is not None)
        if inv.cards:
            log.info("GPUs: %d x %s (%s); %s; checkpoints of GPU containers: %s", len(inv.cards), inv.gpu_type,
                     inv.source, self.cdi_note, self.checkpoints[1])
        return inv.registration()

    def take(self, container_id: str, spec: DeploymentSpec | None) -> dict[str, Any]:
        """ContainerSpec fields for a container's cards ({} without GPUs); CardsRefused when too few are free."""
        count = spec.resources.gpus if spec is not None else 0
        devices = self.ledger.take(container_id, count)
        if not devices:
            return {}
        names: tuple[str, ...] = ()
        note = self.cdi_note
        if self.cdi_spec is not None:
            cards = [(c.index, c.uuid) for c in self.inventory.cards if c.device_id in devices]
            try:
                names = tuple(cdi.cdi_device_names(self.cdi_spec, cards))
            except cdi.CdiError as exc:
                note = f"{exc}: NVIDIA_VISIBLE_DEVICES only"
        grant = GpuGrant(devices, self.cdi_spec if names else None, names,
                         f"levers9: GPUs {','.join(devices)} ({self.inventory.gpu_type}, {self.inventory.source}); "
                         f"{note if not names else 'CDI edits applied'}")
        log.info("container %s: %s", container_id, grant.note)
        return {"gpu": grant}

    def free(self, container_id: str) -> None:
        self.ledger.free(container_id)

    def checkpoint_refusal(self, spec: DeploymentSpec | None) -> str:
        """Why a container of `spec` is not dumped because of its GPUs, "" when that is no reason."""
        if spec is None or spec.resources.gpus == 0 or self.checkpoints[0]:
            return ""
        return f"GPU checkpoints off: {self.checkpoints[1]}"

    def cold_note(self, spec: DeploymentSpec | None) -> str:
        """The ContainerStarted note of a checkpointed GPU deployment that runs cold here, else ""."""
        why = self.checkpoint_refusal(spec)
        return f"cold, no checkpoint: {why}" if why and spec is not None and spec.checkpoint_enabled else ""

    def health(self) -> dict[str, Any]:
        inv = self.inventory
        return {"type": inv.gpu_type, "count": len(inv.cards), "source": inv.source, "driver": inv.driver,
                "note": inv.note, "cdi": self.cdi_note, "checkpoints": self.checkpoints[1],
                "taken": dict(self.ledger.taken)}
