"""The node content cache: LRU eviction (pure), fills from S3 and from a peer, refuses bad hashes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from _served import serving
from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.runtime.config import Settings
from levers9.runtime.storage import ensure_bucket, s3_client
from levers9.worker.images.node_cache import Entry, HashMismatch, NodeCache, cache_app, evict


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(1, 100), st.floats(0, 1000)), max_size=12),
       max_bytes=st.integers(0, 600), incoming=st.integers(0, 100))
def test_eviction_frees_enough_and_least_recently_used_first(sizes, max_bytes, incoming):
    entries = [Entry(f"{i:064x}", size, used) for i, (size, used) in enumerate(sizes)]
    gone = evict(entries, max_bytes, incoming)
    kept = [e for e in entries if e.sha256 not in gone]
    if sum(e.size for e in entries) + incoming <= max_bytes:
        assert gone == []
    elif kept:
        assert sum(e.size for e in kept) + incoming <= max_bytes
    if gone and kept:
        assert max(e.last_used for e in entries if e.sha256 in gone) <= min(e.last_used for e in kept)


def s3_settings(servers) -> Settings:
    return Settings().with_(s3_endpoint=servers["s3_endpoint"], s3_access_key=servers["s3_access_key"],
                    s3_secret_key=servers["s3_secret_key"])


async def put(servers, bucket: str, key: str, data: bytes) -> None:
    async with s3_client(s3_settings(servers)) as c:
        await ensure_bucket(c, bucket)
        await c.put_object(Bucket=bucket, Key=key, Body=data)


async def test_fill_from_s3_checks_the_hash_and_evicts_when_full(servers, tmp_path):
    blob = os.urandom(300_000)
    sha = hashlib.sha256(blob).hexdigest()
    await put(servers, "cache-test", "blob", blob)
    cache = NodeCache(tmp_path / "blobs", s3_settings(servers), max_bytes=500_000)
    path = await cache.get(sha, bucket="cache-test", key="blob")
    assert path.read_bytes() == blob and cache.stats["fills_s3"] == 1
    assert await cache.get(sha) == path and cache.stats["hits"] == 1
    await put(servers, "cache-test", "tampered", blob[:-1] + b"!")
    bad = hashlib.sha256(blob[:-1] + b"?").hexdigest()
    with pytest.raises(HashMismatch):
        await cache.get(bad, bucket="cache-test", key="tampered")
    assert not (tmp_path / "blobs" / bad).exists()
    other = os.urandom(300_000)
    await put(servers, "cache-test", "other", other)
    os.utime(path, (1_000_000, 1_000_000))  # used long ago: the least recently used, without sleeping
    await cache.get(hashlib.sha256(other).hexdigest(), bucket="cache-test", key="other")
    assert not path.exists() and cache.stats["evictions"] == 1  # the least recently used went


async def test_a_peer_fills_a_miss_before_s3(servers, tmp_path):
    blob = os.urandom(100_000)
    sha = hashlib.sha256(blob).hexdigest()
    peer = NodeCache(tmp_path / "peer", s3_settings(servers), max_bytes=10_000_000)
    (tmp_path / "peer" / sha).write_bytes(blob)
    async with serving(cache_app(peer)) as url:
        mine = NodeCache(tmp_path / "mine", s3_settings(servers), max_bytes=10_000_000)
        path = await mine.get(sha, peer=url, bucket="nope", key="nope")
        assert path.read_bytes() == blob and mine.stats["fills_peer"] == 1
        with pytest.raises(FileNotFoundError):
            await mine.get("0" * 64)


async def test_a_range_of_an_object_fills_a_blob_of_its_own(servers, tmp_path):
    archive = os.urandom(50_000)
    await put(servers, "cache-test", "archive", archive)
    cache = NodeCache(tmp_path / "blobs", s3_settings(servers), max_bytes=10_000_000)
    part = archive[12_345:12_345 + 20_000]
    path = await cache.get(hashlib.sha256(part).hexdigest(), bucket="cache-test", key="archive",
                           offset=12_345, length=20_000)
    assert path.read_bytes() == part and cache.stats["bytes_filled"] == 20_000
    # the wrong range for a hash is refused, nothing is kept
    wrong = hashlib.sha256(archive[0:20_000]).hexdigest()
    with pytest.raises(HashMismatch):
        await cache.get(wrong, bucket="cache-test", key="archive", offset=1, length=20_000)
    assert not (tmp_path / "blobs" / wrong).exists()
    # over HTTP: fill=true answers where the blob lies
    from httpx import ASGITransport, AsyncClient
    async with AsyncClient(transport=ASGITransport(app=cache_app(cache)), base_url="http://cache") as client:
        tail = archive[-7:]
        r = await client.get(f"/blobs/{hashlib.sha256(tail).hexdigest()}",
                             params={"bucket": "cache-test", "key": "archive", "offset": 49_993, "length": 7,
                                     "fill": "true"})
        assert r.status_code == 200 and Path(r.json()["path"]).read_bytes() == tail
        r = await client.get(f"/blobs/{'1' * 64}", params={"bucket": "cache-test", "key": "archive", "offset": -1})
        assert r.status_code == 400


# ---- a failed restore: whose fault (levers9.worker.checkpoints.orchestration, checkpoint_policy.restore_failure_verdict)

class _Runtime:
    """Restores whatever tar it is given (the fetch through the node cache is what is tested here)."""

    def __init__(self) -> None:
        self.restored: list[Path] = []

    async def restore(self, cspec, path: Path):
        from levers9.worker.runtime.interface import Started
        self.restored.append(Path(path))
        return Started(address="http://127.0.0.1:9", pid=1, log_path=Path(path))


class _Worker:
    def __init__(self, settings: Settings, cache: NodeCache, cache_url: str) -> None:
        self.settings, self.cache, self.cache_url = settings, cache, cache_url
        self.runtime, self.worker_id, self.emitted = _Runtime(), "w-restore", []

    async def emit(self, c, event) -> None:
        self.emitted.append(event)


def _failed(worker: _Worker) -> list:
    return [e for e in worker.emitted if type(e).__name__ == "CheckpointFailed"]


async def test_a_restore_through_an_unreachable_node_cache_keeps_the_checkpoint_and_the_next_start_restores_it(
        servers, tmp_path):
    """The node cache down: the start goes cold, the error names the node cache, no CheckpointFailed
    (the checkpoint stays `available`); the cache back: the next start restores that checkpoint."""
    from types import SimpleNamespace

    from levers9.contracts.spec import CheckpointRef
    from levers9.stack import free_port
    from levers9.worker.checkpoints.orchestration import Checkpoints

    blob = os.urandom(50_000)
    sha = hashlib.sha256(blob).hexdigest()
    await put(servers, "cache-test", "ckpt.tar", blob)
    settings = s3_settings(servers).with_(secret_key="held")  # this worker holds the keyring: asks no gateway
    cache = NodeCache(tmp_path / "blobs", settings, max_bytes=10_000_000)
    ref = CheckpointRef(checkpoint_id="ck-transient", sha256=sha, bucket="cache-test", key="ckpt.tar")
    c = SimpleNamespace(container_id="c-1", deployment_id="dep-1", workspace="default")
    down = _Worker(settings, cache, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    started, note = await Checkpoints(down).restore(c, None, ref)
    assert started is None and _failed(down) == [], down.emitted
    assert "node cache" in note and "stays available" in note, note
    async with serving(cache_app(cache)) as url:
        up = _Worker(settings, cache, url)
        started, note = await Checkpoints(up).restore(c, None, ref)
        assert started is not None and note == "restored from ck-transient", note
        assert up.runtime.restored and up.runtime.restored[0].read_bytes() == blob and _failed(up) == []


async def test_a_tampered_archive_is_the_checkpoint_s_own_fault_and_marks_it_failed(servers, tmp_path):
    from types import SimpleNamespace

    from levers9.contracts.spec import CheckpointRef
    from levers9.worker.checkpoints.orchestration import Checkpoints

    blob = os.urandom(50_000)
    await put(servers, "cache-test", "tampered.tar", blob[:-1] + b"!")
    settings = s3_settings(servers).with_(secret_key="held")
    cache = NodeCache(tmp_path / "blobs", settings, max_bytes=10_000_000)
    ref = CheckpointRef(checkpoint_id="ck-bad", sha256=hashlib.sha256(blob).hexdigest(), bucket="cache-test",
                        key="tampered.tar")
    async with serving(cache_app(cache)) as url:
        w = _Worker(settings, cache, url)
        started, note = await Checkpoints(w).restore(SimpleNamespace(container_id="c-2", deployment_id="dep-1",
                                                                     workspace="default"), None, ref)
    assert started is None and "failed" in note
    assert [e.checkpoint_id for e in _failed(w)] == ["ck-bad"], w.emitted
