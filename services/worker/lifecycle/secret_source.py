"""Where a container's secrets come from. A worker that holds the secrets keyring (the platform's own
machine: `levers9 up` and its pool workers) opens them from its projection of the log; one without it
(a Kubernetes pool's, an attached cluster's: their configuration carries no platform credential)
asks the gateway, which opens for it only the secrets named by the spec of a container placed on
it. Either way they go only into that container's environment (or its bucket mount).

Sealed checkpoints likewise: such a worker asks the gateway for the data key of the one checkpoint a
placed container restores (`checkpoint_key`), and the node cache opens that archive with it."""

from __future__ import annotations

import base64
from typing import Any, Awaitable, Callable

import httpx

from levers9.runtime.config import Settings
from levers9.runtime.secrets import decrypt

from .placement import Running

Fetch = Callable[[str, list[str]], Awaitable[list[Any]]]  # (workspace, names) -> rows of name, ciphertext


class SecretsUnavailable(RuntimeError):
    pass


def holds_keyring(settings: Settings) -> bool:
    return bool(settings.secrets.key or settings.secrets.key_file)


class SecretSource:
    def __init__(self, settings: Settings, rows: Fetch, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings, self.rows, self.transport = settings, rows, transport

    async def __call__(self, c: Running, names: list[str]) -> dict[str, str]:
        if not names:
            return {}
        found = await (self.local(c.workspace, names) if holds_keyring(self.settings) else self.gateway(c, names))
        missing = sorted(set(names) - set(found))
        if missing:
            raise SecretsUnavailable(f"secret(s) {', '.join(missing)} not found in workspace {c.workspace!r}: "
                                     "create with `levers9 secret create NAME VALUE`")
        return found

    async def local(self, workspace: str, names: list[str]) -> dict[str, str]:
        return {r["name"]: decrypt(self.settings, workspace, r["name"], r["ciphertext"])
                for r in await self.rows(workspace, names)}

    async def gateway(self, c: Running, names: list[str]) -> dict[str, str]:
        url = f"{self.settings.client.gateway_url}/api/v1/internal/deployments/{c.deployment_id}/secrets"
        params = httpx.QueryParams({"workspace": c.workspace, "container_id": c.container_id,
                                    "seq": str(c.scheduled_seq), "names": sorted(set(names))})
        try:
            async with httpx.AsyncClient(timeout=30, transport=self.transport) as client:
                r = await client.get(url, params=params,
                                     headers={"Authorization": f"Bearer {self.settings.worker.token}"})
        except httpx.HTTPError as exc:
            raise SecretsUnavailable(f"the gateway did not give the secrets ({type(exc).__name__}: {exc})") from None
        if r.status_code != 200:
            raise SecretsUnavailable(f"the gateway did not give the secrets ({r.status_code}): {r.text[:300]}")
        return dict(r.json())


class KeyUnavailable(RuntimeError):
    pass


async def checkpoint_key(settings: Settings, c: Running, checkpoint_id: str,
                         transport: httpx.AsyncBaseTransport | None = None) -> bytes | None:
    """The data key of `checkpoint_id`, a checkpoint of the deployment of `c` (placed on this worker),
    from the gateway; None when the archive is not sealed (stored before sealing existed)."""
    url = f"{settings.client.gateway_url}/api/v1/internal/deployments/{c.deployment_id}/checkpoint-key"
    params = {"workspace": c.workspace, "container_id": c.container_id, "seq": str(c.scheduled_seq),
              "checkpoint_id": checkpoint_id}
    try:
        async with httpx.AsyncClient(timeout=30, transport=transport) as client:
            r = await client.get(url, params=params, headers={"Authorization": f"Bearer {settings.worker.token}"})
    except httpx.HTTPError as exc:
        raise KeyUnavailable(f"the gateway did not give its key ({type(exc).__name__}: {exc})") from None
    if r.status_code != 200:
        raise KeyUnavailable(f"the gateway did not give its key ({r.status_code}): {r.text[:300]}")
    try:
        key = base64.b64decode(r.json()["data_key"], validate=True)
    except (ValueError, KeyError, TypeError):
        raise KeyUnavailable(f"the gateway's answer holds no data key: {r.text[:100]}") from None
    if key and len(key) != 32:
        raise KeyUnavailable(f"the gateway gave a {len(key)}-byte key, not an AES-256 key")
    return key or None
