"""The checkpoint-store process. Keeps the checkpoint rows and checks it can reach S3."""

from __future__ import annotations

import asyncio

from aiobotocore.session import get_session

from levers9.runtime.service import Service
from levers9.runtime.views import CheckpointsView


class CheckpointStoreService(Service):
    name = "checkpoint-store"
    projections = (CheckpointsView(),)

    def s3(self):
        s = self.settings
        return get_session().create_client(
            "s3", endpoint_url=s.s3_endpoint, aws_access_key_id=s.s3_access_key,
            aws_secret_access_key=s.s3_secret_key, region_name=s.s3_region)

    async def checks(self) -> dict[str, str]:
        out = await super().checks()
        if not self.settings.s3_endpoint:
            out["s3"] = "LEVERS9_S3_ENDPOINT is not set"
            return out
        try:
            async with self.s3() as client:
                await asyncio.wait_for(client.list_buckets(), timeout=3)
            out["s3"] = "ok"
        except Exception as exc:  # noqa: BLE001 - health reports, never raises
            out["s3"] = f"error: {exc}"
        return out
