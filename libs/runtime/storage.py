"""S3: the one client factory and the one bucket-name rule every service uses."""

from __future__ import annotations

from typing import Any

from aiobotocore.session import get_session

from .config import Settings


def workspace_bucket(workspace: str) -> str:
    """A workspace's bucket: its code archives and its checkpoints."""
    return f"levers9-{workspace}"


def s3_client(settings: Settings) -> Any:
    """An aiobotocore S3 client context manager (`async with s3_client(s) as client:`)."""
    return get_session().create_client(
        "s3", endpoint_url=settings.s3_endpoint, aws_access_key_id=settings.s3_access_key,
        aws_secret_access_key=settings.s3_secret_key, region_name=settings.s3_region)


async def ensure_bucket(client: Any, bucket: str) -> None:
    try:
        await client.head_bucket(Bucket=bucket)
    except client.exceptions.ClientError:
        await client.create_bucket(Bucket=bucket)
