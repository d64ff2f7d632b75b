"""WebSockets end to end (apps/ws_app.py) on the lane's shared stack (`shared_env`): a raw ASGI echo
app answers a WebSocket through the gateway, the connection waiting while its first container
starts, and closing the client closes the container's side (the app logs the client's code); an
`@app.realtime` handler answers each message with its return value; a box running its own WebSocket
server is reached at /box/NAME/; no token is refused (401) and another workspace's endpoint or box
is not found (404), before any upgrade."""

from __future__ import annotations

import asyncio
import os
import tomllib
from pathlib import Path

import aiohttp
import pytest
from _e2e import api, cli, wait_until
from test_e2e_boxes import other_token

pytestmark = pytest.mark.slow

APPS = Path(__file__).parent / "apps"

if os.geteuid() != 0:
    pytest.skip("endpoints and boxes run in runc containers: root needed", allow_module_level=True)


@pytest.fixture(scope="module")
def env(shared_env):
    cli(shared_env, "deploy", str(APPS / "ws_app.py"))
    return shared_env


def profile(env: dict) -> dict:
    return tomllib.loads((Path(env["LEVERS9_HOME"]) / "config.toml").read_text())


def refused(env: dict, path: str, token: str | None) -> int:
    async def go() -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
                await s.ws_connect(profile(env)["gateway_url"] + path, headers=headers)
        return caught.value.status
    return asyncio.run(go())


def talk(env: dict, path: str, send: list[str | bytes], first: bool = False, close: int = 1000
         ) -> tuple[list[str | bytes], str]:
    """Open a WebSocket to `path` with the profile's token, send each message and read one answer to
    each (and the app's first message when `first`), close with `close`; (answers, container id)."""
    async def go() -> tuple[list[str | bytes], str]:
        p = profile(env)
        async with aiohttp.ClientSession() as s, s.ws_connect(
                p["gateway_url"] + path, headers={"Authorization": f"Bearer {p['token']}"}) as ws:
            cid = ws._response.headers.get("x-levers9-container-id", "")
            answers: list[str | bytes] = [await ws.receive_str()] if first else []
            for message in send:
                await (ws.send_str(message) if isinstance(message, str) else ws.send_bytes(message))
                answer = await ws.receive()
                assert answer.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), answer
                answers.append(answer.data)
            await ws.close(code=close)
        return answers, cid
    return asyncio.run(go())


def logs(env: dict, cid: str) -> str:
    return cli(env, "containers", "logs", cid, check=False).stdout


def test_no_token_and_another_workspace_are_refused_before_the_upgrade(env):
    for path in ("/endpoint/wsecho", "/endpoint/shout", "/box/wsbox/"):
        assert refused(env, path, None) == 401, path
    token = other_token(env)
    for path in ("/endpoint/wsecho", "/box/wsbox/"):
        assert refused(env, path, token) == 404, path


def test_an_asgi_app_echoes_through_the_gateway_from_a_cold_start_and_closing_the_client_closes_it(env):
    answers, cid = talk(env, "/endpoint/wsecho/chat?room=1", ["hello", b"\x00\x01"], first=True, close=4001)
    assert answers == ["/chat?room=1", "hello", b"\x00\x01"] and cid
    container = api(env, "GET", f"/api/v1/containers/{cid}").json()
    assert container["deployment_id"].startswith("wsecho-") and container["note"].startswith("cold")  # started for it
    wait_until(lambda: "echo: the client closed with 4001" in logs(env, cid), timeout=30)


def test_a_realtime_handler_answers_each_message(env):
    answers, _ = talk(env, "/endpoint/shout/rt", ["hi", b"abc"])
    assert answers == ['{"upper": "HI", "path": "/rt"}', b"cba"]


def test_a_box_running_its_own_websocket_server(env):
    answers, cid = talk(env, "/box/wsbox/", ["hi"])
    assert answers == ["box:hi"]
    wait_until(lambda: "box: the client closed with 1000" in logs(env, cid), timeout=30)
