"""The catalogue of shared pre-import checkpoints: a versioned JSON document (no I/O here).

`levers9 catalogue build` writes one per flavor (cpu, gpu): which package sets were captured in a
sandbox with those packages imported, what each saves, and the sandbox settings it was captured
with (a worker whose settings differ cannot restore it). The scheduler loads the newest one of each
flavor and `choose_checkpoint` (checkpoint_choice.py) picks per call among cold, these, and the
deployment's own checkpoint.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from .spec import CheckpointRef, ImageRef

CATALOGUE_VERSION = 1
Flavor = Literal["cpu", "gpu"]


class PackageTiming(msgspec.Struct, frozen=True, kw_only=True):
    """One distribution as measured in a sandbox of the flavor's image."""
    distribution: str  # e.g. "scikit-learn"
    version: str = ""
    modules: list[str] = []  # top-level import names that map to it (sklearn)
    import_seconds: Annotated[float, Meta(ge=0)] = 0.0  # median of >= 3 fresh interpreters, with its deps
    rss_mib: Annotated[float, Meta(ge=0)] = 0.0  # resident memory the import adds
    depends_on: list[str] = []  # distributions importing it imports too (sklearn -> numpy, scipy)
    frequency: Annotated[float, Meta(ge=0, le=1)] = 0.0  # share of corpus files importing it


class SandboxSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What a checkpoint was captured with; a restore needs the same."""
    network_mode: str = "bridge"
    overlay: bool = True
    lazy_image: bool = True
    gpu: str = ""  # GPU type, "" for none
    cpu_features: list[str] = []  # flags that code compiled at import may rely on (avx2, avx512f, ...)
    python: str = ""  # major.minor


class SharedCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    checkpoint_id: str
    flavor: Flavor = "cpu"
    image_id: str
    packages: list[PackageTiming]  # what it holds imported
    saves_seconds: Annotated[float, Meta(ge=0)] = 0.0  # import seconds it saves a call importing all of them
    memory_mib: Annotated[float, Meta(ge=0)] = 0.0
    restore_seconds: Annotated[float, Meta(ge=0)] = 0.0  # measured, node cache warm
    size_bytes: int = 0
    settings: SandboxSettings = SandboxSettings()
    executor_generation: int = 1
    ref: CheckpointRef | None = None  # where it is stored: what a restore fetches

    @property
    def distributions(self) -> frozenset[str]:
        return frozenset(p.distribution for p in self.packages)


class Catalogue(msgspec.Struct, frozen=True, kw_only=True):
    version: int = CATALOGUE_VERSION
    catalogue_id: str
    flavor: Flavor = "cpu"
    image_id: str = ""  # the flavor's image: every catalogued package installed
    image: ImageRef | None = None  # that image as a sandbox start needs it (its lazily mounted archive)
    created_at: str = ""
    corpus: dict[str, int] = {}  # corpus name -> files analysed
    packages: list[PackageTiming] = []  # every candidate measured
    checkpoints: list[SharedCheckpoint] = []
    memory_budget_mib: float = 0.0


class CatalogueError(ValueError):
    pass


def decode_catalogue(data: bytes | str) -> Catalogue:
    try:
        cat = msgspec.json.decode(data, type=Catalogue)
    except msgspec.MsgspecError as exc:
        raise CatalogueError(f"the catalogue is not valid: {exc}") from None
    if cat.version != CATALOGUE_VERSION:
        raise CatalogueError(f"catalogue version {cat.version} is not {CATALOGUE_VERSION}: rebuild it with "
                             "`levers9 catalogue build`")
    return cat


def encode_catalogue(cat: Catalogue) -> bytes:
    return msgspec.json.encode(cat)
