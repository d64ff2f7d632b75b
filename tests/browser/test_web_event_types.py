"""The web app registers one EventSource listener per event type (the browser hands a named SSE event
only to a listener of that name), so its list must hold every type of levers9.contracts.events: a
type added there and forgotten here would never update a page live. No browser needed."""

from __future__ import annotations

import re
from pathlib import Path

from levers9.contracts.events import EVENT_TYPES

LIST = Path(__file__).resolve().parents[2] / "services" / "dashboard" / "web" / "lib" / "eventTypes.ts"


def test_the_web_apps_event_types_are_the_contracts():
    listed = set(re.findall(r'"([A-Za-z]+)"', LIST.read_text()))
    assert listed == set(EVENT_TYPES), (f"lib/eventTypes.ts lacks {sorted(set(EVENT_TYPES) - listed)}, "
                                        f"has unknown {sorted(listed - set(EVENT_TYPES))}")
