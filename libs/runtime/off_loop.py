"""File work that can take seconds, done on a thread and never on the event loop.

A container's directory, an unpacked checkpoint, an image's root file system or a code archive hold
thousands of files; removing or unpacking them on the loop stops everything else the process does
meanwhile: the worker's heartbeats, the bytes its egress proxy relays, its answers (stop 33's CI: a
build step waited a minute on the proxy of a loaded worker). `loop_stall` names such a stall;
tests/unit/test_off_loop.py finds the calls that would make one in an `async def`.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path


async def remove_tree(path: str | Path) -> None:
    """`shutil.rmtree(path, ignore_errors=True)` on a thread; it finishes even if the caller is cancelled."""
    await asyncio.to_thread(shutil.rmtree, path, True)


@contextlib.asynccontextmanager
async def scratch_dir(prefix: str, dir: str | Path | None = None) -> AsyncIterator[Path]:
    """An async `tempfile.TemporaryDirectory`: a new directory, removed on a thread afterwards."""
    path = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=prefix, dir=dir))
    try:
        yield path
    finally:
        await remove_tree(path)
