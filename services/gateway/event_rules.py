"""Which events a workspace may read, what of them it may read, and how one is written out.

Pure decisions shared by the events index (views_events.py), `GET /api/v1/events` and the live
stream (routes_events.py), so the list and the stream can never disagree about what a workspace
sees. Isolation comes first: an event is readable by the workspace in its subject; of the platform's
(`_sys`) events only those of workers, which every workspace is shown already (`GET /api/v1/workers`),
and of those only the ones that name no other workspace's objects. A worker of an attached cluster
is its owner's business (and of the workspaces it was shared with), as in the workers list.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import msgspec

from levers9.contracts import SYSTEM_WORKSPACE, Message, subjects
from levers9.contracts.events import EVENT_TYPES

EVERYONE = "*"  # an audience no workspace name can spell (they start with a letter or digit)
CLUSTER_PREFIX = "cluster:"  # the audience of an attached cluster's worker: "cluster:<name>"
# a slot event names a container of one workspace: shown to it alone; a release does not say whose
# container it frees, so it is shown to nobody (the container's own events tell its workspace)
SLOT_OWNED = "WorkerSlotReserved"
HIDDEN = frozenset({"WorkerSlotReleased"})
# fields that are no reader's business even in their own workspace: a token's hash (a dictionary
# attack on a short one), a secret's sealed value, and the container ids of every workspace a fenced
# worker ran
REDACTED = {"TokenCreated": ("token_sha256",), "SecretSet": ("ciphertext",), "WorkerFenced": ("containers",)}


def audience(workspace: str, aggregate: str, event_type: str, data: dict[str, Any], worker_cluster: str = "") -> str:
    """Who may read this event: a workspace name, EVERYONE, `cluster:<name>` (its owner and sharers),
    or "" (nobody). `worker_cluster`: the attached cluster the worker runs on ("" for the platform's)."""
    if workspace != SYSTEM_WORKSPACE:
        return workspace
    if aggregate != "worker" or event_type in HIDDEN:
        return ""
    if event_type == SLOT_OWNED:
        return str(data.get("workspace", ""))
    cluster = str(data.get("cluster", "")) if event_type == "WorkerProvisioned" else worker_cluster
    return CLUSTER_PREFIX + cluster if cluster else EVERYONE


def readable(who: str, workspace: str, clusters: frozenset[str] = frozenset()) -> bool:
    """May `workspace` (that owns or was shared `clusters`) read an event whose audience is `who`?"""
    if who == workspace or who == EVERYONE:
        return bool(who)
    return who.startswith(CLUSTER_PREFIX) and who[len(CLUSTER_PREFIX):] in clusters


def audiences(workspace: str, clusters: frozenset[str]) -> list[str]:
    """Every audience a workspace reads: what the list's query asks for."""
    return [workspace, EVERYONE, *sorted(CLUSTER_PREFIX + c for c in clusters)]


def redact(event_type: str, data: dict[str, Any]) -> dict[str, Any]:
    drop = REDACTED.get(event_type, ())
    return {k: v for k, v in data.items() if k not in drop} if drop else data


def event_data(msg: Message) -> dict[str, Any]:
    """The event's fields as JSON builtins (upcast to the current version), without its type tag, redacted."""
    data = msgspec.to_builtins(msg.event)
    data.pop("type", None)
    return redact(msg.envelope.type, data)


def event_json(seq: int, msg: Message) -> dict[str, Any]:
    """One event as the list and the stream write it."""
    env, subject = msg.envelope, subjects.parse(msg.subject)
    return {"seq": seq, "id": env.id, "type": env.type, "version": type(msg.event).VERSION,
            "occurred_at": env.occurred_at, "workspace": env.workspace, "aggregate": subject.aggregate,
            "aggregate_id": subject.aggregate_id, "correlation_id": env.correlation_id,
            "causation_id": env.causation_id, "data": event_data(msg)}


def row_event(row: Any) -> dict[str, Any]:
    """A gateway.events row as event_json writes it (occurred_at in the envelope's form)."""
    at: dt.datetime = row["occurred_at"]
    data = row["data"]
    return {"seq": row["seq"], "id": row["id"], "type": row["type"], "version": row["version"],
            "occurred_at": at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "workspace": row["workspace"], "aggregate": row["aggregate"], "aggregate_id": row["aggregate_id"],
            "correlation_id": row["correlation_id"], "causation_id": row["causation_id"],
            "data": json.loads(data) if isinstance(data, str) else data}


def sse(event: dict[str, Any]) -> str:
    """One Server-Sent Event: its id is the stream sequence (what Last-Event-ID resumes from)."""
    return f"id: {event['seq']}\nevent: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


# ---- the list's query ---------------------------------------------------------------------------

MAX_LIMIT = 1000
MAX_TEXT = 200  # an id or correlation id longer than this matches nothing anyway


class BadQuery(ValueError):
    """A query parameter that does not validate; the message says which and how to fix it."""


@dataclass(frozen=True)
class EventQuery:
    types: tuple[str, ...] = ()
    aggregate: str = ""
    aggregate_id: str = ""
    correlation_id: str = ""
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    before: int = 0  # 0: from the newest
    limit: int = 100


def parse_time(name: str, value: str) -> dt.datetime:
    try:
        at = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadQuery(f"{name}={value[:60]!r} is not an ISO 8601 time: write e.g. 2026-12-02T12:00:00Z") from None
    return at if at.tzinfo else at.replace(tzinfo=dt.timezone.utc)  # no zone: UTC, as the log writes


def parse_int(name: str, value: str, low: int, high: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise BadQuery(f"{name}={value[:60]!r} is not a whole number") from None
    if not low <= n <= high:
        raise BadQuery(f"{name} must be between {low} and {high}, not {n}")
    return n


def parse_query(params: dict[str, str]) -> EventQuery:
    """GET /api/v1/events' query string, checked; BadQuery says what is wrong."""
    types = tuple(t.strip() for t in params.get("type", "").split(",") if t.strip())
    unknown = [t for t in types if t not in EVENT_TYPES]
    if unknown:
        raise BadQuery(f"unknown event type {unknown[0][:60]!r}: `levers9 events example --help` lists them")
    aggregate = params.get("aggregate", "")
    if aggregate and aggregate not in subjects.AGGREGATES:
        raise BadQuery(f"unknown aggregate {aggregate[:60]!r}; known: {', '.join(subjects.AGGREGATES)}")
    for name in ("aggregate_id", "correlation_id"):
        if len(params.get(name, "")) > MAX_TEXT:
            raise BadQuery(f"{name} is longer than {MAX_TEXT} characters")
    since = parse_time("since", params["since"]) if params.get("since") else None
    until = parse_time("until", params["until"]) if params.get("until") else None
    if since and until and since >= until:
        raise BadQuery("since must be before until")
    before = parse_int("before", params["before"], 1, 2**63 - 1) if params.get("before") else 0
    limit = parse_int("limit", params["limit"], 1, MAX_LIMIT) if params.get("limit") else 100
    return EventQuery(types, aggregate, params.get("aggregate_id", ""), params.get("correlation_id", ""), since, until,
                      before, limit)


def list_sql(q: EventQuery, schema: str = "gateway") -> tuple[str, list[Any]]:
    """The newest `limit + 1` matching events (one more than asked: whether older ones remain) of
    the audiences in $1. One index walk per audience (newest first, each stopping at limit + 1),
    then merged: cheaper than sorting every row of a big workspace."""
    args: list[Any] = []
    where: list[str] = []

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args) + 1}"  # $1 is the audiences

    if q.types:
        where.append(f"type = ANY({arg(list(q.types))}::text[])")
    for column in ("aggregate", "aggregate_id", "correlation_id"):
        if getattr(q, column):
            where.append(f"{column} = {arg(getattr(q, column))}")
    if q.since:
        where.append(f"occurred_at >= {arg(q.since)}")
    if q.until:
        where.append(f"occurred_at < {arg(q.until)}")
    if q.before:
        where.append(f"seq < {arg(q.before)}")
    n = arg(q.limit + 1)
    filters = "".join(f" AND {w}" for w in where)
    sql = (f"SELECT e.* FROM unnest($1::text[]) AS a(audience) CROSS JOIN LATERAL "
           f"(SELECT * FROM {schema}.events WHERE audience = a.audience{filters} ORDER BY seq DESC LIMIT {n}) e "
           f"ORDER BY e.seq DESC LIMIT {n}")
    return sql, args


def resume_point(last_event_id: str, after: str) -> int | None:
    """Where a stream starts: right after this sequence (Last-Event-ID wins over ?after=, as a
    browser's reconnect sends the header while the page's URL keeps its first ?after=); None: only new events."""
    for name, value in (("Last-Event-ID", last_event_id), ("after", after)):
        if value.strip():
            return parse_int(name, value.strip(), 0, 2**63 - 1)
    return None
