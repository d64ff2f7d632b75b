"""A box that keeps its memory (BoxOptions.idle_checkpoint: a notebook) restores its newest dump.

Its idle container is dumped, then stopped (the worker does both, in that order); the dump is stored
a few seconds later. A call that comes meanwhile would restore the dump before it, and a notebook's
kernels would come back without what they held when it went idle. So before such a box asks for a
container, it waits (on the projections, bounded) for its stopping containers to end and for its
dumps to be stored or to fail; then the newest stored one is restored as for any deployment.
"""

from __future__ import annotations

import asyncio
import time

from levers9.contracts.checkpoint_policy import idle_checkpoint

from .state import Deployment
from .state import Gateway as GatewayState

SETTLE_TIMEOUT_S = 120.0  # a dump and its upload take seconds; a worker that died mid-dump, longer
POLL_S = 0.2


async def unsettled(gw: GatewayState, dep: Deployment) -> bool:
    """Whether a container of `dep` is stopping (its dump may be under way) or a dump of it is not
    stored yet."""
    stopping = await gw.pool.fetchval(
        "SELECT count(*) FROM gateway.containers WHERE workspace=$1 AND deployment_id=$2 AND status='stopping'",
        dep.workspace, dep.deployment_id)
    if stopping:
        return True
    return bool(await gw.pool.fetchval(
        "SELECT count(*) FROM gateway.checkpoints WHERE workspace=$1 AND deployment_id=$2 AND status='dumped'",
        dep.workspace, dep.deployment_id))


async def settle(gw: GatewayState, dep: Deployment, timeout: float = SETTLE_TIMEOUT_S) -> None:
    """Wait until `dep`'s idle dump (if any) is stored, at most `timeout` seconds; any other
    deployment returns at once. Past the timeout the newest stored checkpoint is used as it is."""
    if not idle_checkpoint(dep.spec):
        return
    deadline = time.monotonic() + timeout
    while await unsettled(gw, dep) and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)

