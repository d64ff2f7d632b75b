"""The workspace's MCP server at `/mcp`, for agents: the official `mcp` SDK, streamable HTTP.

Stateless (each POST is a whole exchange, so the dashboard may restart or run as replicas) with
JSON answers. app.py lets only requests with `Authorization: Bearer <token>` of a workspace through;
each tool forwards that same token to the gateway, so everything a tool sees or does is scoped to
the token's workspace by the gateway itself. A gateway refusal becomes the tool's error, with the
gateway's sentence.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings

from .auth import Caller
from .routes_views import Refused, chain_of, waterfall_of
from .upstream import GatewayDown, Upstream
from .waterfall import as_text

LOG_TAIL_LINES = 200


def _token(ctx: Context) -> str:
    value = (ctx.headers or {}).get("authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ToolError("no bearer token on this request")
    return token.strip()


def _body(status: int, body: Any, what: str) -> Any:
    if status >= 400:
        detail = body.get("detail") if isinstance(body, dict) else body
        raise ToolError(f"{what}: the gateway answered {status}: {detail}")
    return body


def build(upstream: Upstream) -> MCPServer:
    server = MCPServer(name="levers9", instructions=(
        "levers9 runs code in containers and restores checkpoints instead of booting cold. These tools act "
        "in the workspace of your token: list deployments and containers, read logs, call endpoints and "
        "functions, replay one correlation id's events, explain a container's cold start, stop a deployment."))
    _reading_tools(server, upstream)
    _calling_tools(server, upstream)
    _explaining_tools(server, upstream)
    return server


async def _who(upstream: Upstream, ctx: Context) -> Caller:
    token = _token(ctx)
    found = await upstream.whoami(token)
    if found is None:
        raise ToolError("the gateway does not accept this token")
    return Caller(token=token, workspace=str(found["workspace"]), via="bearer")


def _reading_tools(server: MCPServer, upstream: Upstream) -> None:
    async def get(ctx: Context, path: str, params: Any = None) -> Any:
        try:
            status, body, _ = await upstream.get_json(_token(ctx), path, params)
        except GatewayDown as exc:
            raise ToolError(str(exc)) from None
        return _body(status, body, path)

    @server.tool()
    async def list_deployments(ctx: Context) -> list[dict[str, Any]]:
        """The workspace's deployments: name, version, status, spec."""
        return await get(ctx, "/api/v1/deployments")

    @server.tool()
    async def list_containers(ctx: Context, include_ended: bool = False, limit: int = 50,
                              offset: int = 0) -> dict[str, Any]:
        """The workspace's containers, most recently changed first (live ones unless include_ended)."""
        token = _token(ctx)
        status, body, headers = await upstream.get_json(token, "/api/v1/containers", {
            "all": str(include_ended).lower(), "limit": max(1, min(limit, 1000)), "offset": max(0, offset)})
        return {"containers": _body(status, body, "containers"), "total": int(headers.get("x-total-count") or 0)}

    @server.tool()
    async def container_logs(ctx: Context, container_id: str, lines: int = LOG_TAIL_LINES) -> str:
        """The last `lines` lines of a container's log (stdout and stderr)."""
        r = await upstream.get(_token(ctx), f"/api/v1/containers/{quote(container_id, safe='')}/logs")
        if r.status_code != 200:
            _body(r.status_code, _json(r.text), f"logs of {container_id}")
        return "\n".join(r.text.splitlines()[-max(1, lines):])


def _calling_tools(server: MCPServer, upstream: Upstream) -> None:
    @server.tool()
    async def call_endpoint(ctx: Context, name: str, path: str = "", method: str = "GET",
                            body: str | dict[str, Any] | list[Any] | None = None) -> dict[str, Any]:
        """Call a deployed endpoint (/endpoint/NAME/PATH) with a body (text, or JSON as an object) and
        return its status and body."""
        if method.upper() not in ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"):
            raise ToolError(f"unknown method {method!r}")
        url = f"/endpoint/{quote(name, safe='')}/{quote(path.lstrip('/'), safe='/')}"
        r = await upstream.http.request(method.upper(), f"{upstream.base_url}{url}",
                                        content=None if body is None else body.encode() if isinstance(body, str)
                                        else json.dumps(body).encode(),
                                        headers={**upstream.auth(_token(ctx)), "Content-Type": "application/json"},
                                        timeout=120.0)
        return {"status": r.status_code, "body": r.text[:100_000]}

    @server.tool()
    async def run_function(ctx: Context, app: str, name: str, args: list[Any] | None = None,
                           kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run a deployed Python function with JSON arguments; its result, output and correlation id."""
        r = await upstream.http.post(f"{upstream.base_url}/function/{quote(app, safe='')}/{quote(name, safe='')}",
                                     json={"args": args or [], "kwargs": kwargs or {}},
                                     headers=upstream.auth(_token(ctx)), timeout=600.0)
        return {"status": r.status_code, **_json(r.text)}

    @server.tool()
    async def stop_deployment(ctx: Context, name: str) -> dict[str, Any]:
        """Stop a deployment: its containers are stopped; it can be deployed again."""
        r = await upstream.request("POST", _token(ctx), f"/api/v1/deployments/{quote(name, safe='')}/stop")
        return _body(r.status_code, _json(r.text), f"stop {name}")


def _explaining_tools(server: MCPServer, upstream: Upstream) -> None:
    @server.tool()
    async def events_by_correlation(ctx: Context, correlation_id: str) -> dict[str, Any]:
        """Every event of one correlation id, as a tree by causation (what caused what)."""
        try:
            return await chain_of(upstream, await _who(upstream, ctx), correlation_id)
        except Refused as exc:
            raise ToolError(exc.detail) from None

    @server.tool()
    async def explain_cold_start(ctx: Context, container_id: str) -> str:
        """How a container started: requested, placed, restored or started, ready, first answer, with times."""
        try:
            return as_text(await waterfall_of(upstream, await _who(upstream, ctx), container_id))
        except Refused as exc:
            raise ToolError(exc.detail) from None


def _json(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError:
        return {"body": text[:100_000]}
    return doc if isinstance(doc, dict) else {"body": doc}


def asgi(server: MCPServer) -> Any:
    """The streamable-HTTP ASGI app (served at `/`; app.py routes `/mcp` to it after the bearer check).
    Host checks are off: no cookie is accepted there, so a rebound DNS name gains nothing."""
    return server.streamable_http_app(streamable_http_path="/", stateless_http=True, json_response=True,
                                      transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
