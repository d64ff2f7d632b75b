"""The newest catalogue of shared pre-import checkpoints per flavor, for the placer's decisions.

Loaded from S3 at start (the gateway keeps a pointer to the newest per flavor) and again on each
CatalogueBuilt; a newer catalogue (its id is time-ordered) replaces the one the placer holds.
"""

from __future__ import annotations

import logging
from typing import Any

from levers9.contracts import events as E
from levers9.contracts import subjects
from levers9.contracts.catalogue import Catalogue, CatalogueError
from levers9.runtime.catalogues import fetch, newest
from levers9.runtime.config import Settings
from levers9.runtime.consumer import Delivery, WorkConsumer

log = logging.getLogger("levers9.scheduler.catalogues")

def keep(held: dict[str, Catalogue], cat: Catalogue) -> bool:
    """Hold `cat` when it is newer than the one of its flavor (ids are time-ordered UUIDs)."""
    current = held.get(cat.flavor)
    if current is not None and current.catalogue_id >= cat.catalogue_id:
        return False
    held[cat.flavor] = cat
    return True


def consumer(bus: Any, settings: Settings, held: dict[str, Catalogue]) -> WorkConsumer:
    async def handle(d: Delivery) -> None:
        assert d.message is not None
        ev = d.message.event
        if not isinstance(ev, E.CatalogueBuilt):
            return
        try:
            cat = await fetch(settings, ev.bucket, ev.key)
        except CatalogueError as exc:
            log.warning("catalogue %s is not usable: %s", ev.catalogue_id, exc)
            return
        if keep(held, cat):
            log.info("catalogue %s (%s): %d shared checkpoints", cat.catalogue_id, cat.flavor, len(cat.checkpoints))

    return WorkConsumer(bus, "scheduler-catalogues",
                        [subjects.filter_subject(aggregate="catalogue", event_type="CatalogueBuilt")],
                        handle=handle, max_deliver=20, ack_wait=60)


__all__ = ["consumer", "keep", "newest"]
