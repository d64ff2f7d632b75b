"""`/mcp` driven by the official `mcp` SDK's own client over streamable HTTP, against the FAKE
gateway (tests/fakes): every tool, the bearer token's workspace only, no token no session."""

from __future__ import annotations

import contextlib
import json
from typing import AsyncIterator

import httpx2
import pytest
from fakes.dashboard_harness import dashboard
from fakes.fake_gateway import FakeGateway
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.asyncio(loop_scope="function")

TOOLS = {"list_deployments", "list_containers", "container_logs", "call_endpoint", "run_function",
         "events_by_correlation", "explain_cold_start", "stop_deployment"}


def platform() -> FakeGateway:
    gw = FakeGateway()
    gw.deployments.append({"workspace": "ws-a", "name": "hello", "version": 1, "status": "active"})
    for ws, cid in (("ws-a", "c-a"), ("ws-b", "c-b")):
        gw.containers[cid] = {"workspace": ws, "container_id": cid, "status": "ready", "correlation_id": f"corr-{ws}"}
    gw.logs["c-a"] = "".join(f"line {i}\n" for i in range(10))
    return gw


@contextlib.asynccontextmanager
async def agent(url: str, token: str) -> AsyncIterator[ClientSession]:
    """An MCP client session of the SDK, over streamable HTTP, with a bearer token."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, trust_env=False) as http, \
            streamable_http_client(f"{url}/mcp", http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


def text(result) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "text", None))


def data(result):
    assert not result.is_error, text(result)
    if result.structured_content is not None:
        doc = result.structured_content
        return doc["result"] if isinstance(doc, dict) and set(doc) == {"result"} else doc
    return json.loads(text(result))


async def test_every_tool_through_the_sdk_client(tmp_path):
    gw = platform()
    req = await gw.append("ws-a", "ContainerRequested", "container", "c-a", {"container_id": "c-a"}, correlation_id="corr-ws-a")
    await gw.append("ws-a", "ContainerStarted", "container", "c-a", {"container_id": "c-a", "restored_from": "ck"},
                    correlation_id="corr-ws-a", causation_id=req["id"])
    await gw.append("ws-a", "ContainerReady", "container", "c-a", {"container_id": "c-a"}, correlation_id="corr-ws-a",
                    causation_id=req["id"])
    async with dashboard(tmp_path, gw) as h, agent(h.url, "tok-a") as s:
        assert {t.name for t in (await s.list_tools()).tools} == TOOLS
        assert [d["name"] for d in data(await s.call_tool("list_deployments", {}))] == ["hello"]
        listed = data(await s.call_tool("list_containers", {"limit": 10}))
        assert [c["container_id"] for c in listed["containers"]] == ["c-a"] and listed["total"] == 1
        logs = await s.call_tool("container_logs", {"container_id": "c-a", "lines": 3})
        assert text(logs) == "line 7\nline 8\nline 9"
        answer = data(await s.call_tool("call_endpoint", {"name": "hello", "path": "greet", "method": "POST", "body": "{}"}))
        assert answer["status"] == 200 and json.loads(answer["body"])["workspace"] == "ws-a"
        ran = data(await s.call_tool("run_function", {"app": "demo", "name": "add", "args": [2, 3]}))
        assert ran["status"] == 200 and ran["result"] == 5
        tree = data(await s.call_tool("events_by_correlation", {"correlation_id": "corr-ws-a"}))
        assert [c["event"]["type"] for c in tree["roots"][0]["children"]] == ["ContainerStarted", "ContainerReady"]
        explained = text(await s.call_tool("explain_cold_start", {"container_id": "c-a"}))
        assert "started restored" in explained and "ready" in explained
        stopped = data(await s.call_tool("stop_deployment", {"name": "hello"}))
        assert stopped == {"name": "hello", "stopped": True}
        assert gw.posts == [("ws-a", "/api/v1/deployments/hello/stop")]


async def test_tools_see_only_the_tokens_workspace(tmp_path):
    async with dashboard(tmp_path, platform()) as h, agent(h.url, "tok-b") as s:
        for tool, args in (("container_logs", {"container_id": "c-a"}), ("explain_cold_start", {"container_id": "c-a"}),
                           ("events_by_correlation", {"correlation_id": "corr-ws-a"}),
                           ("stop_deployment", {"name": "hello"})):
            result = await s.call_tool(tool, args)
            assert result.is_error, tool
            assert "404" in text(result) or "no " in text(result), (tool, text(result))
        assert h.gw.posts == []


async def test_no_token_no_mcp(tmp_path):
    async with dashboard(tmp_path, platform()) as h:
        with pytest.raises(Exception):  # noqa: B017 - the SDK's own error for a 401, whatever its class
            async with agent(h.url, "nope"):
                pass
