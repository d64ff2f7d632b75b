"""The fixed MAC address of a levers9 bridge.

A Linux bridge given no address of its own takes the lowest MAC among its ports, and takes another
whenever a port with a lower one joins or the lowest one leaves: every container started or stopped
on the machine (by any worker) could change it. The containers (and netns hosts) on the bridge keep
its old MAC in their ARP caches until the entry goes stale (~30 s), and meanwhile every frame they
send to the bridge's address goes to a port that is not the host: an answer to the gateway was seen
retransmitted for 27 s while another stack's worker started (tcpdump on the bridge; the gateway's
60 s timeout then cut a call the container had answered in 8 s). A set address never changes.
"""

from __future__ import annotations

import hashlib


def bridge_mac(name: str) -> str:
    """A stable, locally administered unicast MAC for the bridge `name` (the same on every start)."""
    digest = hashlib.sha256(f"levers9 bridge {name}".encode()).digest()
    first = (digest[0] & 0xFC) | 0x02  # locally administered (bit 1 set), unicast (bit 0 clear)
    return ":".join(f"{b:02x}" for b in (first, *digest[1:6]))
