"""Checkpoint archives are sealed on their way to S3 and opened on their way back, against real
servers: the checkpoint-store's upload stores a sealed object (no plaintext in S3), the node cache's
sealed fill returns the plaintext (hash checked), and a tampered, moved or key-less fill is refused."""

from __future__ import annotations

import hashlib
import os

import pytest
from _served import serving

from levers9.checkpoint_store.service import CheckpointStoreService
from levers9.runtime import sealing
from levers9.runtime.config import Settings
from levers9.runtime.storage import ensure_bucket, s3_client
from levers9.worker.images.node_cache import HashMismatch, NodeCache, cache_app

BUCKET = "sealing-test"


def settings_of(servers, ring: sealing.Keyring | None) -> Settings:
    return Settings().with_(s3_endpoint=servers["s3_endpoint"], s3_access_key=servers["s3_access_key"],
                    s3_secret_key=servers["s3_secret_key"],
                    secret_key=sealing.dump_keyring(ring) if ring else "")


async def s3_get(s: Settings, key: str) -> bytes:
    async with s3_client(s) as c:
        return await (await c.get_object(Bucket=BUCKET, Key=key))["Body"].read()


async def s3_put(s: Settings, key: str, data: bytes) -> None:
    async with s3_client(s) as c:
        await ensure_bucket(c, BUCKET)
        await c.put_object(Bucket=BUCKET, Key=key, Body=data)


async def test_an_uploaded_checkpoint_is_sealed_in_s3_and_opens_only_where_it_belongs(servers, tmp_path):
    ring = sealing.rotated(None)
    s = settings_of(servers, ring)
    canary = b"LEVERS9_CANARY=" + os.urandom(8).hex().encode()
    plain = os.urandom(9 << 20) + canary + os.urandom(1 << 20)  # more than one 8 MiB part
    sha = hashlib.sha256(plain).hexdigest()
    node = NodeCache(tmp_path / "node", s, max_bytes=1 << 30)
    (tmp_path / "node" / sha).write_bytes(plain)
    async with serving(cache_app(node)) as url:
        size, digest = await CheckpointStoreService(s).upload(f"{url}/blobs/{sha}", BUCKET, "checkpoints/d/c.tar")
    assert (size, digest) == (len(plain), sha)
    stored = await s3_get(s, "checkpoints/d/c.tar")
    assert sealing.is_sealed_archive(stored) and canary not in stored and canary in plain  # + positive control

    # a fresh node fills it from S3 and gets the plaintext back
    fresh = NodeCache(tmp_path / "fresh", s, max_bytes=1 << 30)
    path = await fresh.get(sha, bucket=BUCKET, key="checkpoints/d/c.tar", sealed=True)
    assert path.read_bytes() == plain

    # moved to another key, tampered, or opened without the key: refused, nothing stored
    await s3_put(s, "checkpoints/d/moved.tar", stored)
    tampered = bytearray(stored)
    tampered[len(stored) // 2] ^= 1
    await s3_put(s, "checkpoints/d/tampered.tar", bytes(tampered))
    for key, cache_settings, why in (("checkpoints/d/moved.tar", s, "another secret/location"),
                                     ("checkpoints/d/tampered.tar", s, "integrity check"),
                                     ("checkpoints/d/c.tar", settings_of(servers, sealing.rotated(None)), "does not hold")):
        other = NodeCache(tmp_path / f"n{len(why)}", cache_settings, max_bytes=1 << 30)
        with pytest.raises(HashMismatch, match=why):
            await other.get(sha, bucket=BUCKET, key=key, sealed=True)
        assert not (tmp_path / f"n{len(why)}" / sha).exists()
    for c in (node, fresh):
        await c.close()


async def test_a_checkpoint_stored_before_sealing_still_opens_and_no_key_means_no_upload(servers, tmp_path):
    s = settings_of(servers, sealing.rotated(None))
    legacy = os.urandom(100_000)
    await s3_put(s, "checkpoints/d/legacy.tar", legacy)
    cache = NodeCache(tmp_path / "c", s, max_bytes=1 << 30)
    path = await cache.get(hashlib.sha256(legacy).hexdigest(), bucket=BUCKET, key="checkpoints/d/legacy.tar",
                           sealed=True)
    assert path.read_bytes() == legacy
    await cache.close()
    from levers9.runtime.secrets import SecretKeyMissing
    with pytest.raises(SecretKeyMissing, match="LEVERS9_SECRET_KEY_FILE"):
        await CheckpointStoreService(settings_of(servers, None)).upload("http://127.0.0.1:9/none", BUCKET, "k")


async def test_a_node_without_the_keyring_fills_a_sealed_checkpoint_with_its_data_key_only(servers, tmp_path):
    """A Kubernetes pool's or an attached cluster's node: no keyring; the worker brings the one
    archive's data key (from the gateway) to its node cache as X-Levers9-Data-Key."""
    import base64

    import httpx

    from levers9.runtime.secrets import checkpoint_context

    ring = sealing.rotated(None)
    plain = os.urandom(3 << 20)
    sha = hashlib.sha256(plain).hexdigest()
    key = "checkpoints/d/keyless.tar"
    stored = sealing.seal_archive(ring, plain, checkpoint_context(BUCKET, key))
    await s3_put(settings_of(servers, ring), key, stored)
    data_key = sealing.archive_data_key(ring, stored[:sealing.HEADER_MAX], checkpoint_context(BUCKET, key))
    keyless = NodeCache(tmp_path / "keyless", settings_of(servers, None), max_bytes=1 << 30)
    params = {"bucket": BUCKET, "key": key, "fill": "true", "sealed": "true"}
    async with serving(cache_app(keyless)) as url, httpx.AsyncClient(timeout=60) as client:
        r = await client.get(f"{url}/blobs/{sha}", params=params)  # no key: refused, says why
        assert r.status_code == 502 and "keyring" in r.json()["detail"], r.text
        wrong = base64.b64encode(os.urandom(32)).decode()
        r = await client.get(f"{url}/blobs/{sha}", params=params, headers={"X-Levers9-Data-Key": wrong})
        assert r.status_code == 502 and "integrity check" in r.json()["detail"], r.text
        assert (await client.get(f"{url}/blobs/{sha}", params=params,
                                 headers={"X-Levers9-Data-Key": "%%%"})).status_code == 400
        assert not (tmp_path / "keyless" / sha).exists()
        r = await client.get(f"{url}/blobs/{sha}", params=params,
                             headers={"X-Levers9-Data-Key": base64.b64encode(data_key).decode()})
        assert r.status_code == 200, r.text
    assert (tmp_path / "keyless" / sha).read_bytes() == plain
    await keyless.close()
