"""A container's cold start as a waterfall: requested -> placed -> image mounted -> restored or
started -> ready -> first answer, each phase with its time and the milliseconds since the one before.

A pure function of the container's events (the envelopes the gateway's /api/v1/events answers, and
its calls' FunctionCall* events): no I/O, no clock, so the page, `/mcp`'s explain_cold_start and the
property tests all see the same answer. A phase appears only when the platform says it happened:
"image mounted" is when the worker had the container's root in place (ContainerStarted's
`root_mounted_at`; absent from workers before it and from the process runtime), and "first answer"
is a function call's first FunctionCallFinished or, for an endpoint, the first answer the gateway
proxied (`first_answer_at` of the container's row): absent rather than guessed.

Each phase is the first event of its type after the previous phase, so a container re-requested after
its worker was lost shows the path that led to its start. The kind says how it started: `restored`
(its deployment's own checkpoint), `shared checkpoint` (a shared pre-import checkpoint the cost model
chose) or `cold`; `estimate` is the cost model's estimate (for functions) beside what happened.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Iterable

PHASES = ("requested", "placed", "image mounted", "started", "ready", "first answer")
KINDS = ("restored", "shared checkpoint", "cold")

# the event type that marks each phase; "started" is named "restored" when it restored a checkpoint
PHASE_TYPES = {"requested": "ContainerRequested", "placed": "ContainerScheduled", "started": "ContainerStarted",
               "ready": "ContainerReady"}


def parse_time(value: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _data(ev: dict[str, Any]) -> dict[str, Any]:
    data = ev.get("data")
    return data if isinstance(data, dict) else {}


def _ordered(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """By stream sequence when known (the log's order), else by time."""
    return sorted(events, key=lambda e: (int(e.get("seq") or 0), str(e.get("occurred_at", ""))))


def first_answer(container_id: str, events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first FunctionCallFinished of a call that ran in this container, if any."""
    calls = {_data(e).get("call_id") for e in events
             if e.get("type") == "FunctionCallStarted" and _data(e).get("container_id") == container_id}
    finished = [e for e in events if e.get("type") == "FunctionCallFinished" and _data(e).get("call_id") in calls]
    return finished[0] if finished else None


def kind_of(scheduled: dict[str, Any] | None, started: dict[str, Any] | None) -> str:
    """How it started: what the worker did when it did start, else what the placement planned."""
    chosen = str(((_data(scheduled or {}).get("choice") or {}).get("chosen") or {}).get("candidate", ""))
    if started is not None:
        if not _data(started).get("restored_from"):
            return "cold"
        return "shared checkpoint" if chosen.startswith("shared:") else "restored"
    if chosen.startswith("shared:"):
        return "shared checkpoint"
    return "restored" if (scheduled and _data(scheduled).get("checkpoint")) else "cold"


def estimate_of(scheduled: dict[str, Any] | None, at: dict[str, dt.datetime]) -> dict[str, Any] | None:
    """The cost model's choice (functions only) and, once ready, what the same span took."""
    choice = _data(scheduled or {}).get("choice") or {}
    chosen = choice.get("chosen")
    if not isinstance(chosen, dict):
        return None
    out: dict[str, Any] = {"candidate": chosen.get("candidate", ""), "seconds": chosen.get("seconds"),
                           "missing_imports": chosen.get("missing_imports", [])}
    if isinstance(choice.get("runner_up"), dict):
        out["runner_up"] = {"candidate": choice["runner_up"].get("candidate", ""),
                            "seconds": choice["runner_up"].get("seconds")}
    if "placed" in at and "ready" in at:
        out["actual_seconds"] = round((at["ready"] - at["placed"]).total_seconds(), 4)
        out["actual_span"] = "placed -> ready"
    return out


def waterfall(container_id: str, events: Iterable[dict[str, Any]], first_answer_at: str | None = None
              ) -> dict[str, Any]:
    """{"container_id", "phases": [{"name", "at", "ms"}], "kind", "estimate"}. `events` may hold
    other aggregates' events (its calls'); only this container's and its calls' are used.
    `first_answer_at`: when the gateway proxied the container's first answer (an endpoint's)."""
    evs = _ordered(events)
    own = [e for e in evs if e.get("aggregate_id") == container_id and e.get("aggregate", "container") == "container"]
    phases: list[dict[str, Any]] = []
    at: dict[str, dt.datetime] = {}
    found: dict[str, dict[str, Any]] = {}
    position = 0  # each phase is looked for after the one before
    for name in PHASE_TYPES:
        for i in range(position, len(own)):
            if own[i].get("type") == PHASE_TYPES[name]:
                found[name], position = own[i], i + 1
                break
    mounted = _data(found.get("started") or {}).get("root_mounted_at")
    if mounted:  # said by the start it belongs to
        found["image mounted"] = {"occurred_at": mounted, "id": found["started"].get("id", "")}
    answer = first_answer(container_id, evs)
    if answer is None and first_answer_at and "ready" in found:
        answer = {"occurred_at": first_answer_at, "id": ""}
    if answer is not None:
        found["first answer"] = answer
    previous: dt.datetime | None = None
    for name in PHASES:
        ev = found.get(name)
        if ev is None:
            continue
        t = parse_time(str(ev["occurred_at"]))
        t = t.replace(microsecond=t.microsecond // 1000 * 1000)  # what `at` shows, so the ms add up
        if previous is not None and t < previous:  # clocks of two machines: never a phase before its cause
            t = previous
        label = "restored" if name == "started" and _data(ev).get("restored_from") else name
        ms = 0.0 if previous is None else round((t - previous).total_seconds() * 1000, 1)
        phases.append({"name": label, "at": iso(t), "ms": ms, "event_id": ev.get("id", "")})
        at[name], previous = t, t
    scheduled = found.get("placed")
    return {"container_id": container_id, "phases": phases, "kind": kind_of(scheduled, found.get("started")),
            "estimate": estimate_of(scheduled, at)}


def as_text(w: dict[str, Any]) -> str:
    """The waterfall in words, for an agent (MCP explain_cold_start) or a terminal."""
    if not w["phases"]:
        return f"container {w['container_id']}: no events of its start yet."
    lines = [f"container {w['container_id']} started {w['kind']}:"]
    for p in w["phases"]:
        lines.append(f"  {p['name']:<14} at {p['at']}  (+{p['ms']:.1f} ms)")
    total = sum(p["ms"] for p in w["phases"])
    lines.append(f"  total {total:.1f} ms from {w['phases'][0]['name']} to {w['phases'][-1]['name']}")
    missing = [n for n in ("image mounted", "first answer")
               if n not in {p["name"] for p in w["phases"]}]
    if missing:
        lines.append(f"  (not in the log: {', '.join(missing)})")
    est = w.get("estimate")
    if est:
        line = f"  the cost model chose {est['candidate']} estimating {est['seconds']} s"
        if "actual_seconds" in est:
            line += f"; {est['actual_span']} took {est['actual_seconds']} s"
        if est.get("runner_up"):
            line += f" (runner-up {est['runner_up']['candidate']}: {est['runner_up']['seconds']} s)"
        lines.append(line)
    return "\n".join(lines)
