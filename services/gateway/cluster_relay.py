"""The gateway's side of attached clusters' agents: one stream per connected agent, and the core NATS
requests of the pool controller (`levers9rpc.cluster.<name>.<op>`) relayed over it.

A gateway subscribes to a cluster's requests only while that cluster's agent is connected to it, so
a request for a cluster whose agent is connected nowhere gets no responder at all, which the pool
controller reports as "its agent is not connected". A second connection of the same cluster replaces
the first. What the agent says on its stream: replies to the requests it was sent (by id), heartbeats,
and the workers whose pods ended; those are kept until the pool controller asks (op `exited`), and
only for workers started through this stream (an agent cannot report another cluster's workers).

The messages are JSON text frames: `command` (to the agent) and what `report` reads (from it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from levers9.runtime.nats_auth import CLUSTER_RPC

log = logging.getLogger("levers9.gateway.clusters")

REPLY_WITHIN_S = 12.0  # below the pool controller's request timeout, so it hears the reason
HEARTBEAT_S = 10.0  # the agent's; an agent silent for 3 of them is cut off (its TCP may be dead)
SILENT_S = 3 * HEARTBEAT_S
OPS = ("start", "stop", "exited")

Send = Callable[[str], Awaitable[None]]


@dataclass
class Agent:
    cluster: str
    workspace: str
    send: Send
    namespace: str = ""
    connected_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    started: set[str] = field(default_factory=set)  # workers started through this stream
    exited: dict[str, str] = field(default_factory=dict)  # worker -> why, until the controller asks
    pending: dict[str, asyncio.Future] = field(default_factory=dict)  # request id -> its reply
    next_id: int = 0
    subscription: Any = None
    close: Callable[[], Awaitable[None]] | None = None  # ends its stream (detached, or replaced)


def parse_op(subject: str, cluster: str) -> str:
    """The op of a request subject for `cluster` ("" if it is not one of ours)."""
    prefix = f"{CLUSTER_RPC}.{cluster}."
    op = subject[len(prefix):] if subject.startswith(prefix) else ""
    return op if op in OPS else ""


def command(op: str, request_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """What the agent is sent for a start or stop: the request's body and its id."""
    return {**body, "type": op, "id": request_id}


class ClusterRelay:
    def __init__(self, nc: Callable[[], Any]) -> None:
        self.nc = nc
        self.agents: dict[str, Agent] = {}

    def connected(self, cluster: str) -> Agent | None:
        return self.agents.get(cluster)

    async def attach(self, agent: Agent) -> None:
        old = self.agents.get(agent.cluster)
        if old is not None:
            await self.detach(old)
        self.agents[agent.cluster] = agent

        async def handle(msg: Any) -> None:
            await msg.respond(json.dumps(await self.relay(agent, msg.subject, msg.data)).encode())

        agent.subscription = await self.nc().subscribe(f"{CLUSTER_RPC}.{agent.cluster}.*", cb=handle)
        log.info("cluster %s: agent connected (namespace %s)", agent.cluster, agent.namespace or "?")

    async def detach(self, agent: Agent) -> None:
        if self.agents.get(agent.cluster) is agent:
            del self.agents[agent.cluster]
        if agent.subscription is not None:
            try:
                await agent.subscription.unsubscribe()
            except Exception:  # noqa: BLE001 - a closed connection has no subscription left to drop
                pass
            agent.subscription = None
        if agent.close is not None:
            close, agent.close = agent.close, None
            try:
                await close()
            except Exception:  # noqa: BLE001 - closed already
                pass
        for fut in agent.pending.values():
            if not fut.done():
                fut.set_result({"ok": False, "error": "the agent disconnected before it answered"})
        log.info("cluster %s: agent disconnected", agent.cluster)

    async def relay(self, agent: Agent, subject: str, data: bytes) -> dict[str, Any]:
        """The answer to one request of the pool controller."""
        op = parse_op(subject, agent.cluster)
        try:
            body = json.loads(data or b"{}")
        except ValueError:
            return {"ok": False, "error": "the request is not JSON"}
        if op == "exited":
            out, agent.exited = agent.exited, {}
            return {"ok": True, "exited": out}
        if not op or not isinstance(body, dict):
            return {"ok": False, "error": f"unknown request {subject!r}"}
        agent.next_id += 1
        request_id = str(agent.next_id)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        agent.pending[request_id] = fut
        try:
            await agent.send(json.dumps(command(op, request_id, body)))
            reply = await asyncio.wait_for(fut, REPLY_WITHIN_S)
        except asyncio.TimeoutError:
            reply = {"ok": False, "error": f"the agent did not answer within {REPLY_WITHIN_S:.0f} s"}
        except Exception as e:  # noqa: BLE001 - a stream that broke mid-send: say so to the controller
            reply = {"ok": False, "error": f"the agent's stream failed: {e}"}
        finally:
            agent.pending.pop(request_id, None)
        if op == "start" and reply.get("ok"):
            agent.started.add(str(body.get("worker_id", "")))
        return reply

    def report(self, agent: Agent, message: dict[str, Any]) -> None:
        """One message of the agent: a reply, a heartbeat or an exited pod."""
        agent.last_seen = time.time()
        kind = message.get("type")
        if kind == "reply":
            fut = agent.pending.get(str(message.get("id", "")))
            if fut is not None and not fut.done():
                fut.set_result({"ok": bool(message.get("ok")), "error": str(message.get("error", ""))})
        elif kind == "exited":
            worker_id = str(message.get("worker_id", ""))
            if worker_id in agent.started:  # never another cluster's worker
                agent.started.discard(worker_id)
                agent.exited[worker_id] = str(message.get("why", "its pod ended"))
