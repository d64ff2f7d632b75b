"""This gateway's load, told to the scheduler's autoscaler every second (core NATS, never the log).

The autoscaler (levers9.scheduler.autoscaler) decides from what calls wait and what each container
serves; only the gateways know that. Each publishes one sample a second on
`levers9load.<its id>`: per deployment (its router: an endpoint's or ASGI app's proxied calls, and a
deployed function's calls, REST, Python or tasks, which take their sandboxes from the same router,
function_plans.plan_for), the calls waiting and, per container, the calls in flight and when its
last call ended. The autoscaler keeps the latest per gateway for a few
seconds and sums them; a gateway that stops publishing drops out. Level triggered: a lost sample is
replaced by the next one. Sessions' routers are one caller's sandboxes, no deployment's load.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Mapping

from levers9.contracts import uuid7
from levers9.runtime.nats_auth import LOAD_SUBJECT

from .router import DeploymentRouter

log = logging.getLogger("levers9.gateway.load")

EVERY_S = 1.0


def sample(gateway_id: str, routers: Mapping[str, DeploymentRouter]) -> dict[str, Any]:
    deployments: dict[str, Any] = {}
    for key, r in list(routers.items()):
        workspace, sep, deployment_id = key.partition("/")
        if not sep or deployment_id != r.deployment_id:
            continue
        deployments[key] = {"waiting": r.waiting,
                            "containers": {cid: [s.inflight, s.last_used] for cid, s in r.containers.items()}}
    # "at": when this was true; the autoscaler counts a container idle only up to there
    return {"gateway": gateway_id, "at": time.time(), "deployments": deployments}


async def run(nc: Any, routers: Mapping[str, DeploymentRouter], stop: asyncio.Event) -> None:
    """Publish a sample every second until stopped (one that fails is replaced by the next)."""
    gateway_id = uuid7()
    while not stop.is_set():
        try:
            await nc.publish(f"{LOAD_SUBJECT}.{gateway_id}", json.dumps(sample(gateway_id, routers)).encode())
        except Exception:  # noqa: BLE001 - the next sample goes out a second later
            log.warning("load sample not published", exc_info=True)
        try:
            await asyncio.wait_for(stop.wait(), EVERY_S)
        except asyncio.TimeoutError:
            pass
