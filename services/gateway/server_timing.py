"""The `Server-Timing` header of a proxied call (pure: times are arguments): the call's own phases, so a
caller sees its cold start without asking the platform.

- queued: from the call reaching the gateway to it holding a slot on a ready container (all of it);
- placed: the part of that wait the container it got spent being placed (requested → scheduled);
- started or restored: the part it spent starting (scheduled → ready), named by how it started;
- first-byte: from holding the slot to the answer's head coming back from the container.

placed and started/restored appear only when the container became ready while the call waited, and
each is clipped to the call's own wait: a container another call had asked for earlier contributes only
the part this call saw. Times are this gateway's: when it took the call and heard each event.
"""

from __future__ import annotations

from typing import Mapping

Phase = tuple[str, float, str]  # metric name, duration in ms, description


def phases(began: float, acquired: float, head: float, seen: Mapping[str, float], restored: bool) -> list[Phase]:
    """The phases of one call, from monotonic times: it came at `began`, held a slot at `acquired`, had
    the answer's head at `head`; `seen` is when the gateway heard each status of the answering container."""
    out: list[Phase] = [("queued", span(began, acquired), "waited for a ready container")]
    ready = seen.get("ready")
    if ready is not None and ready > began:
        scheduled = seen.get("scheduled", seen.get("starting", ready))
        requested = seen.get("requested", scheduled)
        placed = span(max(requested, began), max(scheduled, began))
        if placed > 0:
            out.append(("placed", placed, "its container was placed on a worker"))
        kind = "restored" if restored else "started"
        out.append((kind, span(max(scheduled, began), ready),
                    "its container was restored from a checkpoint" if restored else "its container started cold"))
    out.append(("first-byte", span(acquired, head), "the container's answer began"))
    return out


def span(start: float, end: float) -> float:
    """Milliseconds from start to end, never negative (clocks read in either order)."""
    return round(max(0.0, end - start) * 1000, 1)


def header(items: list[Phase]) -> str:
    """The header's value (RFC: `name;dur=ms;desc="…"`, comma separated)."""
    return ", ".join(f'{name};dur={ms:g};desc="{desc}"' for name, ms, desc in items)
