"""Fresh randomness after a restore: every sandbox restored from one checkpoint would otherwise draw
the same "random" numbers, and the same temporary file names, as the process that was dumped."""

from __future__ import annotations

import os
import random
import sys
import tempfile


def reseed() -> list[str]:
    """Reseed `random`, numpy's global generator (when numpy is imported) and tempfile's name
    generator from the kernel's entropy; the names of what was reseeded."""
    random.seed(os.urandom(32))
    done = ["random"]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed(int.from_bytes(os.urandom(4), "little"))
            done.append("numpy.random")
        except Exception:  # noqa: BLE001 - a numpy without the legacy global generator: nothing to reseed
            pass
    tempfile._name_sequence = None  # type: ignore[attr-defined]  # made again, from a fresh Random, on next use
    done.append("tempfile")
    return done
