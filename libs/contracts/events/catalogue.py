"""Events of catalogues of shared pre-import checkpoints (platform aggregate, workspace `_sys`).

Which of a catalogue's checkpoints a worker can restore is a worker event (worker.py,
WorkerCatalogueChecked).
"""

from __future__ import annotations

from .base import Event


class CatalogueBuilt(Event, frozen=True, kw_only=True):
    """A catalogue of shared pre-import checkpoints is in S3; a flavor's newest replaces the one before."""
    AGGREGATE = "catalogue"
    ID_FIELD = "catalogue_id"
    SYSTEM = True
    catalogue_id: str
    flavor: str = "cpu"
    image_id: str = ""
    bucket: str
    key: str
    sha256: str
    checkpoints: list[str] = []
