"""The subject scheme, computed here and nowhere else.

`levers9.<workspace>.<aggregate>.<aggregate_id>.<EventType>`; platform aggregates use workspace `_sys`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ids import InvalidName, check_id, check_workspace

ROOT = "levers9"
STREAM = "LEVERS9"
DLQ_STREAM = "LEVERS9_DLQ"
DLQ_ROOT = "levers9dlq"
AGGREGATES = ("deployment", "container", "worker", "pool", "checkpoint", "image", "token", "secret", "call", "catalogue",
              "volume", "cluster", "task", "schedule", "sandbox")


@dataclass(frozen=True)
class Subject:
    workspace: str
    aggregate: str
    aggregate_id: str
    event_type: str

    def __str__(self) -> str:
        return f"{ROOT}.{self.workspace}.{self.aggregate}.{self.aggregate_id}.{self.event_type}"


def subject(workspace: str, aggregate: str, aggregate_id: str, event_type: str) -> str:
    check_workspace(workspace)
    check_id(aggregate_id, f"{aggregate} id")
    if aggregate not in AGGREGATES:
        raise InvalidName(f"unknown aggregate {aggregate!r}; known: {', '.join(AGGREGATES)}")
    check_id(event_type, "event type")
    return f"{ROOT}.{workspace}.{aggregate}.{aggregate_id}.{event_type}"


def aggregate_subject(workspace: str, aggregate: str, aggregate_id: str) -> str:
    """All events of one aggregate: the filter for optimistic concurrency on that aggregate."""
    return subject(workspace, aggregate, aggregate_id, "x")[: -len(".x")] + ".*"


def parse(value: str) -> Subject:
    parts = value.split(".")
    if len(parts) != 5 or parts[0] != ROOT:
        raise InvalidName(f"subject {value!r} is not levers9.<workspace>.<aggregate>.<id>.<EventType>")
    _, workspace, aggregate, aggregate_id, event_type = parts
    subject(workspace, aggregate, aggregate_id, event_type)  # validates every token
    return Subject(workspace, aggregate, aggregate_id, event_type)


def filter_subject(workspace: str | None = None, aggregate: str | None = None,
                   aggregate_id: str | None = None, event_type: str | None = None) -> str:
    """A server-side filter; None means any. Tokens are validated so a filter cannot widen itself."""
    if workspace is not None:
        check_workspace(workspace)
    if aggregate is not None and aggregate not in AGGREGATES:
        raise InvalidName(f"unknown aggregate {aggregate!r}; known: {', '.join(AGGREGATES)}")
    if aggregate_id is not None:
        check_id(aggregate_id, "aggregate id")
    if event_type is not None:
        check_id(event_type, "event type")
    tokens = [workspace or "*", aggregate or "*", aggregate_id or "*", event_type or "*"]
    return ".".join([ROOT, *tokens])


def dlq_subject(original: str) -> str:
    return f"{DLQ_ROOT}.{original}" if original.startswith(ROOT + ".") else f"{DLQ_ROOT}.foreign"
