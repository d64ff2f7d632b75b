"""A worker's GPUs: its inventory, and which cards each container gets. Pure but for `read_nvml`.

A pool has ONE GPU type (PoolConfig.gpu_type, given to its workers as LEVERS9_WORKER_GPU_TYPE).
The inventory:
- `detected`: NVML (nvidia-ml-py, imported lazily) answers with at least one card: index, uuid,
  name, memory and the driver version of each. Only the cards of the pool's type are offered; a card
  of another type is left out and the inventory's `note` says which and why.
- `configured`: no NVML here (no library, no driver, or no card): the pool's gpu_type and
  gpus_per_worker are taken on trust. `levers9 workers list` shows which one a worker has.

Type names: NVML says "NVIDIA H100 80GB HBM3", a pool says "H100". `gpu_type_of` maps both the same
way: drop the vendor words (NVIDIA, Tesla, GeForce, Quadro), split on spaces and dashes, keep the
first word (with the next one after RTX or TITAN), upper-case: "NVIDIA A100-SXM4-80GB" -> "A100",
"NVIDIA GeForce RTX 4090" -> "RTX4090", "Tesla T4" -> "T4". A pool type "A100-80GB" is then "A100"
too: memory variants are not told apart.

Cards: `choose_cards` gives a container `count` (1 to 8) cards of this node that no running container
holds, the lowest indices first; it refuses with a sentence when there are not enough. `CardLedger`
remembers who holds which until the container is freed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_CARDS_PER_CONTAINER = 8
DETECTED, CONFIGURED = "detected", "configured"
VENDOR_WORDS = frozenset({"NVIDIA", "TESLA", "GEFORCE", "QUADRO"})
JOINED_WORDS = frozenset({"RTX", "TITAN"})  # "RTX 4090" is a type, "RTX" alone is not


@dataclass(frozen=True)
class Card:
    index: int
    uuid: str = ""  # "GPU-…" when NVML told it; configured cards have none
    name: str = ""
    memory_mib: int = 0

    @property
    def device_id(self) -> str:
        """How NVIDIA_VISIBLE_DEVICES and CUDA name it: the uuid (stable inside a container), else the index."""
        return self.uuid or str(self.index)


@dataclass(frozen=True)
class Detected:
    """What NVML answered: every card of the node and the driver version."""
    cards: tuple[Card, ...]
    driver: str


@dataclass(frozen=True)
class Inventory:
    source: str  # detected | configured | "" (no GPUs)
    gpu_type: str
    cards: tuple[Card, ...] = ()
    driver: str = ""  # the NVIDIA driver version; "" without NVML
    note: str = ""  # what did not match the pool's configuration

    def registration(self) -> dict[str, Any]:
        """The fields of WorkerRegistered that describe the GPUs."""
        return {"gpu_type": self.gpu_type if self.cards else "", "gpu_count": len(self.cards),
                "gpu_source": self.source if self.cards else "", "gpu_ids": [c.device_id for c in self.cards],
                "gpu_driver": self.driver}


def gpu_type_of(name: str) -> str:
    """The GPU type of an NVML card name or of a pool's configured type (see the module docstring)."""
    words = [w for w in re.split(r"[\s\-]+", name.strip()) if w and w.upper() not in VENDOR_WORDS]
    if not words:
        return ""
    head = words[0]
    if head.upper() in JOINED_WORDS and len(words) > 1:
        head += words[1]
    return re.sub(r"[^A-Za-z0-9_.]", "", head).lstrip("_.").upper()[:32]  # a valid spec GpuType, or ""


def choose_inventory(detected: Detected | None, pool_type: str, configured_count: int) -> Inventory:
    """The inventory a worker registers: NVML's cards of the pool's type when NVML found any, else the
    pool's configuration."""
    if detected is not None and detected.cards:
        return _from_detected(detected, pool_type, configured_count)
    if configured_count > 0 and pool_type:
        return Inventory(CONFIGURED, pool_type, tuple(Card(i) for i in range(configured_count)))
    if configured_count > 0:
        return Inventory("", "", note=f"gpus_per_worker={configured_count} without a gpu_type: no GPUs offered "
                                      "(a pool has one GPU type; set gpu_type)")
    if pool_type:
        return Inventory("", pool_type, note=f"the pool's gpu_type is {pool_type} but no card was detected and "
                                             "gpus_per_worker is 0: no GPUs offered")
    return Inventory("", "")


def _from_detected(detected: Detected, pool_type: str, configured_count: int) -> Inventory:
    wanted = gpu_type_of(pool_type) if pool_type else gpu_type_of(detected.cards[0].name)
    kept = tuple(c for c in detected.cards if gpu_type_of(c.name) == wanted)
    left = [c for c in detected.cards if gpu_type_of(c.name) != wanted]
    notes = []
    if left:
        names = ", ".join(f"{c.index}: {c.name} ({gpu_type_of(c.name)})" for c in left)
        notes.append(f"{len(left)} card(s) not of the pool's type {pool_type or wanted} left out: {names}")
    if configured_count and configured_count != len(kept):
        notes.append(f"gpus_per_worker={configured_count} but {len(kept)} card(s) of type {wanted} detected: "
                     "the detected ones are offered")
    return Inventory(DETECTED, pool_type or wanted, kept, detected.driver, "; ".join(notes))


def read_nvml() -> Detected | None:
    """The node's cards from NVML; None when NVML is not there (no nvidia-ml-py, no driver, no device)."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cards = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            cards.append(Card(i, _text(pynvml.nvmlDeviceGetUUID(h)), _text(pynvml.nvmlDeviceGetName(h)),
                              int(pynvml.nvmlDeviceGetMemoryInfo(h).total) >> 20))
        return Detected(tuple(cards), driver)
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# ---- which cards a container gets ----------------------------------------------------------------

class CardsRefused(ValueError):
    """Not enough free cards for a container (the message says how many and who holds them)."""


def choose_cards(cards: Sequence[str], taken: Mapping[str, Sequence[str]], count: int) -> tuple[str, ...]:
    """`count` of `cards` (device ids in index order) that nobody in `taken` (container -> its cards)
    holds, the lowest first; () for count 0. Raises CardsRefused."""
    if count <= 0:
        return ()
    if count > MAX_CARDS_PER_CONTAINER:
        raise CardsRefused(f"{count} GPUs asked: a container gets at most {MAX_CARDS_PER_CONTAINER} cards of one node")
    held = {card for owned in taken.values() for card in owned}
    free = [c for c in cards if c not in held]
    if len(free) < count:
        raise CardsRefused(f"{count} GPU(s) asked, {len(free)} of this node's {len(cards)} free "
                           f"({len(held)} held by {len(taken)} running container(s))")
    return tuple(free[:count])


@dataclass
class CardLedger:
    """Which running container holds which cards of this node."""
    cards: tuple[str, ...]
    taken: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def take(self, container_id: str, count: int) -> tuple[str, ...]:
        if container_id in self.taken:  # a second start of the same container keeps its cards
            return self.taken[container_id]
        chosen = choose_cards(self.cards, self.taken, count)
        if chosen:
            self.taken[container_id] = chosen
        return chosen

    def free(self, container_id: str) -> None:
        self.taken.pop(container_id, None)


@dataclass(frozen=True)
class GpuGrant:
    """The cards a container was given and how: NVIDIA_VISIBLE_DEVICES always, CDI edits when a spec is."""
    devices: tuple[str, ...]  # device ids (uuids or indices) -> NVIDIA_VISIBLE_DEVICES
    cdi_spec: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    cdi_devices: tuple[str, ...] = ()  # the spec's names of those cards
    note: str = ""  # one line for the container's log: which cards, and whether CDI applied

    @property
    def env(self) -> dict[str, str]:
        return {"NVIDIA_VISIBLE_DEVICES": ",".join(self.devices)}
