"""The gateway's secret routes on a fake state (no servers): a value is sealed before it is
appended, bound to its workspace and name; no answer or error quotes it; rewrap and key use are
for the admin workspace and move every stored secret to the primary key."""

from __future__ import annotations

import pytest
from test_gateway_routes import OTHER, USER, FakeBus, FakePool, client

from levers9.contracts import events as E
from levers9.gateway.auth import Caller
from levers9.gateway.service import GatewayService
from levers9.runtime import sealing
from levers9.runtime import secrets as S
from levers9.runtime.config import Settings
from levers9.runtime.tokens import token_hash

CANARY = "l9canary-unit-5b1d0c"


def gateway(tmp_path, with_key: bool = True) -> GatewayService:
    keys = tmp_path / "keys.json"
    if with_key:
        S.write_keyring(keys, sealing.rotated(None))
    g = GatewayService(Settings().with_(secret_key_file=str(keys)))
    g.pool = FakePool()
    g.bus = FakeBus(g)
    g.tokens = {token_hash(USER): Caller(workspace="default", token_id="u"),
                token_hash(OTHER): Caller(workspace="other", token_id="o")}
    return g


async def test_a_set_secret_is_sealed_for_its_workspace_and_name_and_never_answered(tmp_path):
    gw = gateway(tmp_path)
    async with client(gw, OTHER) as c:
        r = await c.post("/api/v1/secrets", json={"name": "API_KEY", "value": CANARY})
    assert r.status_code == 201 and CANARY not in r.text
    [env] = gw.bus.published
    [ev] = gw.bus.events()
    assert isinstance(ev, E.SecretSet) and env.workspace == "other" and CANARY not in ev.ciphertext
    assert S.decrypt(gw.settings, "other", "API_KEY", ev.ciphertext) == CANARY
    with pytest.raises(S.SecretUnreadable):
        S.decrypt(gw.settings, "default", "API_KEY", ev.ciphertext)


@pytest.mark.parametrize("body", [{"value": CANARY}, {"name": "not a name", "value": CANARY},
                                  {"name": "A", "value": CANARY * 5000}, CANARY, [CANARY],
                                  {"name": CANARY, "value": 1}])
async def test_a_refused_secret_is_not_quoted_in_the_error(tmp_path, body):
    gw = gateway(tmp_path)
    async with client(gw) as c:
        r = await c.post("/api/v1/secrets", json=body)
    assert r.status_code == 422 and r.json()["detail"]
    assert CANARY not in r.text or body == {"name": CANARY, "value": 1}  # a name is not secret
    assert gw.bus.published == []


async def test_without_a_key_setting_a_secret_is_a_clear_503(tmp_path):
    gw = gateway(tmp_path, with_key=False)
    async with client(gw) as c:
        r = await c.post("/api/v1/secrets", json={"name": "API_KEY", "value": CANARY})
    assert r.status_code == 503 and "keyring file" in r.json()["detail"] and CANARY not in r.text
    assert gw.bus.published == []


async def test_rewrap_moves_every_workspace_to_the_primary_key_and_is_for_the_admin_only(tmp_path):
    gw = gateway(tmp_path)
    old = S.keyring(gw.settings)
    rows = [{"workspace": ws, "name": "API_KEY", "ciphertext": S.encrypt(gw.settings, ws, "API_KEY", CANARY + ws)}
            for ws in ("default", "other")]
    S.write_keyring(tmp_path / "keys.json", sealing.rotated(old))
    new = S.keyring(gw.settings)
    current = S.encrypt(gw.settings, "default", "NEW", CANARY)
    gw.pool.answer("FROM gateway.secrets", [*rows, {"workspace": "default", "name": "NEW", "ciphertext": current},
                                            {"workspace": "default", "name": "OLD", "ciphertext": "gAAAAAfernet"}])
    async with client(gw, OTHER) as c:
        assert (await c.post("/api/v1/secrets/rewrap")).status_code == 403
        assert (await c.get("/api/v1/secrets/keys")).status_code == 403
    async with client(gw) as c:
        keys = (await c.get("/api/v1/secrets/keys")).json()
        assert keys == {"primary": new.primary, "keys": sorted(new.keys),
                        "by_key": {old.primary: 2, new.primary: 1, "unreadable": 1}}
        r = await c.post("/api/v1/secrets/rewrap")
    done = r.json()
    assert r.status_code == 200 and CANARY not in r.text
    assert (done["primary"], done["secrets"], done["rewrapped"]) == (new.primary, 4, 2)
    assert [f["name"] for f in done["failed"]] == ["OLD"] and "older levers9" in done["failed"][0]["reason"]
    appended = {(env.workspace, ev.name): ev.ciphertext for env, ev in zip(gw.bus.published, gw.bus.events())}
    assert set(appended) == {("default", "API_KEY"), ("other", "API_KEY")}
    for (ws, name), token in appended.items():
        assert sealing.value_key_id(token) == new.primary
        assert S.decrypt(gw.settings, ws, name, token) == CANARY + ws
