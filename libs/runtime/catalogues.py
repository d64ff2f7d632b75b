"""Catalogues of shared pre-import checkpoints in S3: the newest per flavor, and one by its key.

The gateway stores them (a pointer `catalogues/<flavor>/latest.json` names the newest); the
scheduler and the workers read them.
"""

from __future__ import annotations

import json
import logging

from levers9.contracts.catalogue import Catalogue, decode_catalogue

from .config import Settings
from .storage import s3_client

log = logging.getLogger("levers9.catalogues")

PLATFORM_BUCKET = "levers9-platform"
FLAVORS = ("cpu", "gpu")


async def fetch(settings: Settings, bucket: str, key: str) -> Catalogue:
    async with s3_client(settings) as client:
        got = await client.get_object(Bucket=bucket, Key=key)
        async with got["Body"] as body:
            return decode_catalogue(await body.read())


async def newest_of(settings: Settings, flavor: str) -> Catalogue | None:
    """The newest catalogue of `flavor` (the pointer the gateway keeps), or None when there is none."""
    async with s3_client(settings) as client:
        try:
            pointer = await client.get_object(Bucket=PLATFORM_BUCKET, Key=f"catalogues/{flavor}/latest.json")
        except client.exceptions.ClientError:
            return None
        async with pointer["Body"] as body:
            key = json.loads(await body.read())["key"]
    return await fetch(settings, PLATFORM_BUCKET, key)


async def newest(settings: Settings) -> dict[str, Catalogue]:
    """The newest catalogue of each flavor there is one of."""
    found: dict[str, Catalogue] = {}
    if not settings.storage.s3_endpoint:
        return found
    for flavor in FLAVORS:
        try:
            cat = await newest_of(settings, flavor)
        except Exception:  # noqa: BLE001 - S3 away (or a bad document): functions start cold meanwhile
            log.warning("the %s catalogue could not be loaded", flavor, exc_info=True)
            continue
        if cat is not None:
            found[flavor] = cat
    return found
