"""A levers9 bridge's own MAC (levers9.runtime.bridge_mac): stable, locally administered, unicast,
and not another bridge's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from levers9.runtime.bridge_mac import bridge_mac

NAMES = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_"), min_size=1, max_size=15)


@given(NAMES)
def test_a_bridge_mac_is_stable_locally_administered_and_unicast(name):
    mac = bridge_mac(name)
    octets = [int(part, 16) for part in mac.split(":")]
    assert len(octets) == 6 and mac == bridge_mac(name) and mac == mac.lower()
    assert octets[0] & 0x02 and not octets[0] & 0x01


@given(NAMES, NAMES)
def test_two_bridges_get_two_macs(a, b):
    if a != b:
        assert bridge_mac(a) != bridge_mac(b)
