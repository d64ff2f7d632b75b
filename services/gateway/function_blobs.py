"""Values over 4 MiB travel through S3 by reference, in the workspace's bucket under `calls/`.

A client uploads a large input to a presigned URL and sends its key; the gateway reads it for the
call and deletes it once the call ends. A large result is written there and the client fetches it
from a presigned URL; it is deleted BLOB_KEPT_S later (the client may still be reading it when the
stream ends).
"""

from __future__ import annotations

import asyncio
import logging
import re

from levers9.contracts import uuid7
from levers9.contracts.proto import functions_pb2 as pb
from levers9.runtime.storage import ensure_bucket, s3_client, workspace_bucket

from .executor_client import Outcome
from .function_calls import Plan
from .state import Gateway as GatewayState

log = logging.getLogger("levers9.gateway.blobs")

URL_EXPIRES_S = 900
BLOB_KEPT_S = 900.0
KEY_RE = re.compile(r"^calls/[0-9a-f-]{36}$")


class BlobError(Exception):
    pass


class Blobs:
    def __init__(self, gw: GatewayState) -> None:
        self.gw = gw

    async def upload_url(self, plan: Plan, ask: pb.UploadRequest) -> pb.ServerMessage:
        bucket, key = workspace_bucket(plan.workspace), f"calls/{uuid7()}"
        async with s3_client(self.gw.settings, presign=True) as client:
            await ensure_bucket(client, bucket)
            url = await client.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key},
                                                      ExpiresIn=URL_EXPIRES_S)
        return pb.ServerMessage(upload=pb.UploadUrl(index=ask.index, url=url, blob_key=key))

    async def input_bytes(self, plan: Plan, given: pb.Input) -> bytes:
        """The input's pickled arguments: inline, or read (then deleted) from S3."""
        if not given.blob_key:
            return bytes(given.args)
        if not KEY_RE.match(given.blob_key):
            raise BlobError(f"blob key {given.blob_key!r} is not one this gateway handed out")
        bucket = workspace_bucket(plan.workspace)
        async with s3_client(self.gw.settings) as client:
            got = await client.get_object(Bucket=bucket, Key=given.blob_key)
            async with got["Body"] as body:
                data = await body.read()
            await client.delete_object(Bucket=bucket, Key=given.blob_key)
        return bytes(data)

    async def result_url(self, plan: Plan, call_id: str, outcome: Outcome) -> str:
        bucket, key = workspace_bucket(plan.workspace), f"calls/{call_id}"
        async with s3_client(self.gw.settings, presign=True) as client:
            await ensure_bucket(client, bucket)
            await client.put_object(Bucket=bucket, Key=key, Body=outcome.value)
            url = await client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key},
                                                      ExpiresIn=URL_EXPIRES_S)
        task = asyncio.create_task(self.delete_later(bucket, key))
        self.gw.background_tasks.add(task)
        task.add_done_callback(self.gw.background_tasks.discard)
        return url

    async def delete_later(self, bucket: str, key: str) -> None:
        await asyncio.sleep(BLOB_KEPT_S)
        try:
            async with s3_client(self.gw.settings) as client:
                await client.delete_object(Bucket=bucket, Key=key)
        except Exception:  # noqa: BLE001 - a result left behind is garbage, not a failure
            log.warning("could not delete %s/%s", bucket, key, exc_info=True)
