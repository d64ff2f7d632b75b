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
from levers9.worker.node_cache import Entry, HashMismatch, NodeCache, cache_app, evict


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
    return Settings(s3_endpoint=servers["s3_endpoint"], s3_access_key=servers["s3_access_key"],
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
