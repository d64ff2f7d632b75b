"""Idle dumps a newer one superseded are deleted.

A box with `idle_checkpoint` (a notebook) is dumped each time it goes idle, ~100 MB each (its
kernels' memory): kept, they would pile up in its workspace's bucket for ever, and only the newest is
ever restored (the gateway picks the newest available). Once a new dump of such a box is stored, its
deployment's checkpoints older than the newest KEEP_IDLE_DUMPS are deleted (CheckpointDeleted: the
object is removed, every projection says deleted). Two are kept, not one: a start that chose the one
before, just before the newest was stored, still finds it.

Other deployments' checkpoints (one per version, taken at first answer; sandboxes' snapshots, which
their users take and delete) are never touched here. A dump still on its node (dumped, not stored)
is not counted and not deleted: its upload decides its fate.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from levers9.contracts import caused_by
from levers9.contracts import events as E
from levers9.contracts.checkpoint_policy import idle_checkpoint
from levers9.contracts.spec import spec_from_builtins

log = logging.getLogger("levers9.checkpoint_store")

KEEP_IDLE_DUMPS = 2
PRUNABLE = ("available", "restore_failed")  # stored in S3; a failed restore's object is no use either


class Stored(NamedTuple):
    checkpoint_id: str
    status: str


def superseded(newest_first: Sequence[Stored], stored_now: str, keep: int = KEEP_IDLE_DUMPS) -> list[str]:
    """The checkpoints to delete once `stored_now` is stored (pure): every stored one past the newest
    `keep` (`stored_now` counts among them even where the projection does not show it stored yet)."""
    kept = [stored_now]
    out = []
    for c in newest_first:
        if c.checkpoint_id == stored_now or c.status not in PRUNABLE:
            continue
        if len(kept) < keep:
            kept.append(c.checkpoint_id)
        else:
            out.append(c.checkpoint_id)
    return out


def keeps_idle_dumps(spec_json: str | dict) -> bool:
    """Whether a deployment's spec (its projection's jsonb) is a box dumped when idle."""
    try:
        return idle_checkpoint(spec_from_builtins(json.loads(spec_json) if isinstance(spec_json, str) else spec_json))
    except (msgspec.ValidationError, ValueError, TypeError):
        return False


async def prune_idle_dumps(pool: Any, publish: Any, env: Any, ev: E.CheckpointDumped) -> list[str]:
    """After `ev`'s checkpoint was stored: delete what it superseded, if its deployment keeps idle dumps.
    `env` is the dump's envelope (the deletions are caused by it); returns the ids deleted."""
    spec_json = await pool.fetchval("SELECT spec FROM checkpoint_store.deployments WHERE workspace=$1 AND "
                                    "deployment_id=$2", env.workspace, ev.deployment_id)
    if spec_json is None or not keeps_idle_dumps(spec_json):
        return []
    rows = await pool.fetch("SELECT checkpoint_id, status FROM checkpoint_store.checkpoints WHERE workspace=$1 AND "
                            "deployment_id=$2 ORDER BY created_at DESC, checkpoint_id DESC",
                            env.workspace, ev.deployment_id)
    gone = superseded([Stored(r["checkpoint_id"], r["status"]) for r in rows], ev.checkpoint_id)
    for checkpoint_id in gone:
        await publish(caused_by(env, E.CheckpointDeleted(checkpoint_id=checkpoint_id)))
    if gone:
        log.info("deployment %s: %d idle dumps superseded by %s deleted: %s", ev.deployment_id, len(gone),
                 ev.checkpoint_id, gone)
    return gone
