"""A worker with the secrets keyring opens a container's secrets itself; one without it (Kubernetes
pools, attached clusters) asks the gateway for exactly those names of that placed container."""

from __future__ import annotations

import httpx
import pytest

from levers9.runtime import sealing
from levers9.runtime.config import Settings
from levers9.runtime.secrets import encrypt
from levers9.worker.lifecycle.placement import Running
from levers9.worker.lifecycle.secret_source import SecretSource, SecretsUnavailable, holds_keyring

RING = sealing.dump_keyring(sealing.rotated(None))


def running() -> Running:
    return Running(container_id="c1", workspace="acme", deployment_id="app-v2", correlation_id="x", started_at=0.0,
                   scheduled_seq=42)


async def test_with_the_keyring_it_opens_its_projection_and_says_what_is_missing():
    s = Settings().with_(secret_key=RING)
    sealed = encrypt(s, "acme", "API_KEY", "v1")

    async def rows(workspace, names):
        assert workspace == "acme"
        return [{"name": "API_KEY", "ciphertext": sealed}]

    source = SecretSource(s, rows, transport=httpx.MockTransport(lambda r: pytest.fail("asked the gateway")))
    assert holds_keyring(s) and await source(running(), ["API_KEY"]) == {"API_KEY": "v1"}
    assert await source(running(), []) == {}
    with pytest.raises(SecretsUnavailable, match="OTHER not found in workspace 'acme'"):
        await source(running(), ["API_KEY", "OTHER"])


async def test_without_the_keyring_it_asks_the_gateway_with_its_token_for_that_placement():
    s = Settings().with_(gateway_url="http://gw", worker_token="l9_worker")
    seen: list[httpx.Request] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"API_KEY": "v1"})

    async def rows(workspace, names):
        pytest.fail("read the projection without a keyring")

    source = SecretSource(s, rows, transport=httpx.MockTransport(gateway))
    assert not holds_keyring(s) and await source(running(), ["API_KEY"]) == {"API_KEY": "v1"}
    [req] = seen
    assert req.url.path == "/api/v1/internal/deployments/app-v2/secrets"
    assert dict(req.url.params) | {"names": req.url.params.get_list("names")} == {
        "workspace": "acme", "container_id": "c1", "seq": "42", "names": ["API_KEY"]}
    assert req.headers["Authorization"] == "Bearer l9_worker"
    refused = SecretSource(s, rows, transport=httpx.MockTransport(lambda r: httpx.Response(404, text="not placed")))
    with pytest.raises(SecretsUnavailable, match="404"):
        await refused(running(), ["API_KEY"])
