"""`levers9 agent`: runs in an attached cluster and keeps one stream open to the platform's gateway.

It dials out (nothing connects into the cluster): a WebSocket to /api/v1/clusters/<name>/agent,
authenticated by the cluster's join token (`levers9 clusters attach` printed it). Over that stream:
- the gateway sends start and stop requests of the pool controller; the agent creates or deletes the
  worker's Secret and Pod in its namespace (agent_pods.py) and replies with the outcome;
- the agent sends a heartbeat every HEARTBEAT_S, and the workers whose pods ended (it lists its pods
  every POLL_S).
A stream that fails is dialled again with exponential backoff (1 s doubling to 30 s, jittered); a
refused token (401/403) ends the agent with exit code 2 and the gateway's reason, since retrying
cannot help.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp

from .agent_pods import BadRequest, Pods, read_start

log = logging.getLogger("levers9.agent")

HEARTBEAT_S = 10.0
POLL_S = 2.0
BACKOFF_MAX_S = 30.0


class Refused(Exception):
    """The gateway refused the join token (401/403): dialling again cannot help."""


@dataclass(frozen=True)
class AgentConfig:
    gateway_url: str
    token: str
    cluster: str
    namespace: str = "levers9-agent"


def stream_url(gateway_url: str, cluster: str, namespace: str) -> str:
    """ws(s)://<gateway>/api/v1/clusters/<cluster>/agent from the gateway's http(s) URL."""
    parts = urlsplit(gateway_url.rstrip("/"))
    scheme = {"https": "wss", "http": "ws"}.get(parts.scheme, parts.scheme)
    path = f"{parts.path}/api/v1/clusters/{quote(cluster, safe='')}/agent"
    return urlunsplit((scheme, parts.netloc, path, f"namespace={quote(namespace)}", ""))


def backoff(attempt: int, rng: random.Random | None = None) -> float:
    """Seconds before dial number `attempt` (1, 2, ...): doubling from 1 s to BACKOFF_MAX_S, +-20 %."""
    base = min(BACKOFF_MAX_S, 2.0 ** max(0, attempt - 1))
    return base * (0.8 + 0.4 * (rng or random).random())


def handle(pods: Pods, cfg: AgentConfig, message: dict[str, Any]) -> dict[str, Any] | None:
    """The reply to one message of the gateway (None: nothing to reply). Blocking: run in a thread."""
    kind, request_id = message.get("type"), str(message.get("id", ""))
    if kind == "start":
        try:
            error = pods.start(read_start(message, cfg.namespace, cfg.gateway_url))
        except BadRequest as e:
            error = f"bad start request: {e}"
        return {"type": "reply", "id": request_id, "ok": not error, "error": error}
    if kind == "stop":
        pods.stop(str(message.get("worker_id", "")))
        return {"type": "reply", "id": request_id, "ok": True, "error": ""}
    return None


async def run(cfg: AgentConfig, pods: Pods, stop: asyncio.Event | None = None) -> None:
    """Dial, serve, dial again; returns when `stop` is set, raises Refused when the token is refused."""
    stop = stop or asyncio.Event()
    attempt = 0
    while not stop.is_set():
        attempt += 1
        try:
            await serve_once(cfg, pods, stop)
            attempt = 0  # it was connected: the next dial starts from the shortest wait
        except aiohttp.WSServerHandshakeError as e:
            if e.status in (401, 403):
                raise Refused(f"the gateway refused this agent's join token (HTTP {e.status}): {e.message}; "
                              "attach the cluster again (`levers9 clusters attach`) and use its new token") from None
            log.warning("gateway stream refused (HTTP %s); dialling again", e.status)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            log.warning("gateway stream failed (%s: %s); dialling again", type(e).__name__, e)
        if not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), backoff(max(1, attempt)))
            except asyncio.TimeoutError:
                pass


async def serve_once(cfg: AgentConfig, pods: Pods, stop: asyncio.Event) -> None:
    """One connection: until the gateway closes it, it fails, or `stop`."""
    headers = {"Authorization": f"Bearer {cfg.token}"}
    async with aiohttp.ClientSession() as session, session.ws_connect(
            stream_url(cfg.gateway_url, cfg.cluster, cfg.namespace), headers=headers,
            timeout=aiohttp.ClientWSTimeout(ws_close=5.0)) as ws:
        log.info("connected to %s as the agent of cluster %s (namespace %s)", cfg.gateway_url, cfg.cluster,
                 cfg.namespace)
        tasks = [asyncio.create_task(_heartbeats(ws)), asyncio.create_task(_report_ended(ws, pods)),
                 asyncio.create_task(_closing(ws, stop))]
        try:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                message = json.loads(msg.data)
                reply = await asyncio.to_thread(handle, pods, cfg, message) if isinstance(message, dict) else None
                if reply is not None:
                    await ws.send_str(json.dumps(reply))
        finally:
            for t in tasks:
                t.cancel()


async def _heartbeats(ws: Any) -> None:
    while True:
        await ws.send_str(json.dumps({"type": "heartbeat"}))
        await asyncio.sleep(HEARTBEAT_S)


async def _report_ended(ws: Any, pods: Pods) -> None:
    while True:
        await asyncio.sleep(POLL_S)
        try:
            ended = await asyncio.to_thread(pods.ended)
        except Exception as e:  # noqa: BLE001 - the API is down for a while: list again next time
            log.warning("listing pods failed: %s", e)
            continue
        for worker_id, why in ended.items():
            await ws.send_str(json.dumps({"type": "exited", "worker_id": worker_id, "why": why}))


async def _closing(ws: Any, stop: asyncio.Event) -> None:
    await stop.wait()
    await ws.close()
