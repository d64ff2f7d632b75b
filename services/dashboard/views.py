"""The composed views, as pure functions of what the gateway answered: the overview, and one
correlation id's events as a tree by causation.

No I/O here (routes_views.py fetches), so each is tested on plain values.
"""

from __future__ import annotations

import collections
from typing import Any, Iterable

FAILURE_TYPES = ("ContainerFailed", "ImageBuildFailed", "CheckpointFailed", "WorkerLost")
ENDED = ("stopped", "failed")
MAX_DEPTH = 100  # a chain deeper than this (only a publisher's own events could make one) is cut


def deployments_view(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per deployment name: its versions (newest first) and the newest one's status."""
    by_name: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in rows:
        by_name[str(row.get("name", ""))].append(row)
    out = []
    for name, versions in sorted(by_name.items()):
        versions.sort(key=lambda r: int(r.get("version") or 0), reverse=True)
        newest = versions[0]
        out.append({"name": name, "version": newest.get("version"), "status": newest.get("status"),
                    "deployment_id": newest.get("deployment_id"), "created_at": newest.get("created_at"),
                    "versions": [{"version": v.get("version"), "status": v.get("status"),
                                  "deployment_id": v.get("deployment_id")} for v in versions]})
    return out


def containers_view(live: Iterable[dict[str, Any]], total: int) -> dict[str, Any]:
    """Live containers counted by state; the ended ones (stopped or failed) as one number: the
    gateway's list is paged and counted, never loaded whole."""
    by_state = collections.Counter(str(c.get("status", "")) for c in live)
    live_count = sum(n for s, n in by_state.items() if s not in ENDED)
    return {"by_state": dict(sorted(by_state.items())), "live": live_count, "total": total,
            "ended": max(0, total - sum(by_state.values()))}


def _free(w: dict[str, Any], total: str, used: str) -> int:
    return max(0, int(w.get(total) or 0) - int(w.get(used) or 0))


def workers_view(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Each worker with its free capacity, and each pool summed, with its GPU types."""
    workers = []
    pools: dict[str, dict[str, Any]] = {}
    for w in rows:
        free = {"cpu_millicores": _free(w, "cpu_millicores", "cpu_used"), "memory_mib": _free(w, "memory_mib", "memory_used"),
                "gpus": _free(w, "gpu_count", "gpu_used")}
        workers.append({"worker_id": w.get("worker_id"), "pool": w.get("pool", ""), "status": w.get("status"),
                        "cordoned": bool(w.get("cordoned")), "draining": bool(w.get("draining")),
                        "gpu_type": w.get("gpu_type", ""), "gpu_count": int(w.get("gpu_count") or 0),
                        "cluster": w.get("cluster", ""), "free": free})
        pool = pools.setdefault(str(w.get("pool", "")), {"pool": w.get("pool", ""), "workers": 0, "ready": 0,
                                                         "free": {"cpu_millicores": 0, "memory_mib": 0, "gpus": 0},
                                                         "gpu_types": []})
        pool["workers"] += 1
        takes_work = w.get("status") == "ready" and not w.get("cordoned") and not w.get("draining")
        if takes_work:
            pool["ready"] += 1
            for k, v in free.items():
                pool["free"][k] += v
        if w.get("gpu_type") and w["gpu_type"] not in pool["gpu_types"]:
            pool["gpu_types"].append(w["gpu_type"])
    return {"workers": workers, "pools": sorted(pools.values(), key=lambda p: str(p["pool"]))}


def failures_view(events: Iterable[dict[str, Any]], limit: int = 20) -> list[dict[str, Any]]:
    out = []
    for e in events:
        data: dict[str, Any] = e["data"] if isinstance(e.get("data"), dict) else {}
        reason = data.get("reason") or data.get("error") or data.get("error_type") or ""
        out.append({"seq": e.get("seq"), "at": e.get("occurred_at"), "type": e.get("type"),
                    "aggregate": e.get("aggregate"), "aggregate_id": e.get("aggregate_id"),
                    "correlation_id": e.get("correlation_id"), "reason": str(reason)})
    return out[:limit]


def chain(correlation_id: str, events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """{"correlation_id", "roots": [{"event", "children": [...]}]}: each event under the event that
    caused it, in log order. An event whose cause is not in the chain is a root; so is one that a
    causation loop or MAX_DEPTH would hide (never dropped)."""
    evs = sorted({str(e.get("id")): e for e in events}.values(), key=lambda e: int(e.get("seq") or 0))
    nodes: dict[str, dict[str, Any]] = {str(e.get("id")): {"event": e, "children": []} for e in evs}
    children: dict[str, list[str]] = collections.defaultdict(list)
    roots: list[str] = []
    for e in evs:
        eid, cause = str(e.get("id")), str(e.get("causation_id") or "")
        if cause and cause != eid and cause in nodes:
            children[cause].append(eid)
        else:
            roots.append(eid)
    placed: set[str] = set()

    def attach(root: str) -> None:
        stack = [(root, 0)]
        placed.add(root)
        while stack:
            eid, depth = stack.pop()
            for child in children.get(eid, []):
                if child in placed:
                    continue
                if depth + 1 >= MAX_DEPTH:
                    roots.append(child)  # cut here: it becomes a root of its own, attached later
                    continue
                placed.add(child)
                nodes[eid]["children"].append(nodes[child])
                stack.append((child, depth + 1))

    i = 0
    while i < len(roots):
        if roots[i] not in placed:
            attach(roots[i])
        i += 1
    for e in evs:  # a causation loop has no root: its first event becomes one
        eid = str(e.get("id"))
        if eid not in placed:
            roots.append(eid)
            attach(eid)
    return {"correlation_id": correlation_id, "count": len(evs),
            "roots": [nodes[r] for r in dict.fromkeys(roots)]}
