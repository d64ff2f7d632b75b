"""A node cache port held by another levers9 home (another S3) is not shared: the worker stops with
the reason instead of filling code and checkpoints from the other home's S3."""

from __future__ import annotations

import pytest
from _served import serving

from levers9.runtime.config import Settings
from levers9.stack import free_port
from levers9.worker.images.node_cache import CacheTaken, NodeCache, cache_app, shared_cache_or_exit


async def test_a_cache_of_another_home_is_refused_and_one_of_ours_is_shared(tmp_path):
    ours, theirs = Settings().with_(s3_endpoint="http://127.0.0.1:1111"), Settings().with_(s3_endpoint="http://127.0.0.1:2222")
    cache = NodeCache(tmp_path / "blobs", theirs, max_bytes=1 << 20)
    try:
        async with serving(cache_app(cache)) as url:
            with pytest.raises(CacheTaken, match="belongs to another levers9 home"):
                await shared_cache_or_exit(url, ours)
            await shared_cache_or_exit(url, theirs)  # the same home's: shared
    finally:
        await cache.close()
    with pytest.raises(CacheTaken, match="not a levers9 node cache"):
        await shared_cache_or_exit(f"http://127.0.0.1:{free_port()}", ours)
