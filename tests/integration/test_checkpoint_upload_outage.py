"""S3 unreachable during a checkpoint upload: the checkpoint-store does not fail the checkpoint; it
raises S3Unavailable, which its consumer treats as transient (the event is tried again until S3 is
back). The whole outage is exercised in tests/e2e/test_faults.py (S3 down for 30 s)."""

from __future__ import annotations

import hashlib
import os

import pytest
from _served import serving

from levers9.checkpoint_store.service import CheckpointStoreService
from levers9.runtime import sealing
from levers9.runtime.config import Settings
from levers9.runtime.consumer import is_transient
from levers9.runtime.storage import S3_UNREACHABLE, S3Unavailable
from levers9.stack import free_port
from levers9.worker.images.node_cache import NodeCache, cache_app


async def test_an_upload_to_an_unreachable_s3_raises_a_transient_error_not_a_failure(tmp_path):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    s = Settings().with_(s3_endpoint=down, secret_key=sealing.dump_keyring(sealing.rotated(None)))
    plain = os.urandom(1 << 16)
    sha = hashlib.sha256(plain).hexdigest()
    node = NodeCache(tmp_path / "node", s, max_bytes=1 << 30)
    (tmp_path / "node" / sha).write_bytes(plain)
    try:
        async with serving(cache_app(node)) as url:
            with pytest.raises(S3_UNREACHABLE):
                await CheckpointStoreService(s).upload(f"{url}/blobs/{sha}", "b", "checkpoints/d/c.tar")
    finally:
        await node.close()
    # what on_event turns it into: retried by the consumer, never dead-lettered nor failed
    assert is_transient(S3Unavailable("S3 is unreachable"))
    assert not is_transient(RuntimeError("the node cache answered 404"))
