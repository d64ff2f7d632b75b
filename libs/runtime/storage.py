"""S3: the one client factory and the one bucket-name rule every service uses."""

from __future__ import annotations

import functools
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    ReadTimeoutError,
)

from .config import Settings

# S3 itself is unreachable (the transport failed, or something else answers on its port), as opposed
# to S3 answering with an error: callers wait for it or say it is down, they do not fail the object
S3_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError,
                  HTTPClientError)


class S3Unavailable(ConnectionError):
    """S3 is unreachable. A ConnectionError, so a consumer retries the event instead of failing it."""


def workspace_bucket(workspace: str) -> str:
    """A workspace's bucket: its code archives and its checkpoints."""
    return f"levers9-{workspace}"


@functools.cache
def _session() -> AioSession:
    # one session per process: a new session loads botocore's service models again each time (a
    # health check building one per call grew the checkpoint-store by ~12 MiB before levelling off)
    return get_session()


def s3_client(settings: Settings, presign: bool = False) -> Any:
    """An aiobotocore S3 client context manager (`async with s3_client(s) as client:`). `presign`:
    for presigned URLs, signed with SigV4 (whose query signature covers only the host, so a plain
    HTTP client's own headers do not break it)."""
    config = AioConfig(signature_version="s3v4") if presign else None
    return _session().create_client(
        "s3", endpoint_url=settings.storage.s3_endpoint, aws_access_key_id=settings.storage.s3_access_key,
        aws_secret_access_key=settings.storage.s3_secret_key, region_name=settings.storage.s3_region, config=config)


async def ensure_bucket(client: Any, bucket: str) -> None:
    try:
        await client.head_bucket(Bucket=bucket)
    except client.exceptions.ClientError:
        await client.create_bucket(Bucket=bucket)
