"""JSON Schemas of every event's envelope, for publishers in other systems."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from .events import EVENT_TYPES, Event


def event_schema(cls: type[Event]) -> dict:
    """The schema of a whole envelope whose `data` is this event's body (current version)."""
    body = msgspec.json.schema(cls)
    defs = body.get("$defs", {})
    own = defs.pop(cls.__name__)
    own["properties"].pop("type", None)  # the type is in the envelope, not the body
    own["required"] = [r for r in own.get("required", []) if r != "type"]
    uuid = {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"}
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": cls.__name__,
        "description": (cls.__doc__ or "").strip() or f"levers9 event {cls.__name__}",
        "type": "object",
        "properties": {
            "id": uuid | {"description": "UUIDv7; also the Nats-Msg-Id header"},
            "type": {"const": cls.__name__},
            "version": {"const": cls.VERSION},
            "occurred_at": {"type": "string", "format": "date-time"},
            "workspace": {"type": "string", "pattern": "^([a-z0-9][a-z0-9-]{0,62}|_sys)$"},
            "correlation_id": {"type": "string"},
            "causation_id": {"type": ["string", "null"]},
            "data": own,
        },
        "required": ["id", "type", "version", "occurred_at", "workspace", "correlation_id", "data"],
        "x-levers9-subject": f"levers9.<workspace>.{cls.AGGREGATE}.<data.{cls.ID_FIELD}>.{cls.__name__}",
    }
    if defs:
        schema["$defs"] = defs
    return schema


def write_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, cls in sorted(EVENT_TYPES.items()):
        path = directory / f"{name}.schema.json"
        path.write_text(json.dumps(event_schema(cls), indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
