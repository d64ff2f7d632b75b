"""The stack's servers get ports below the kernel's ephemeral range, so an outgoing connection cannot
take one between choosing it and the server's bind."""

from __future__ import annotations

import socket

from levers9.runtime import ports as port_choice
from levers9.stack import procs


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    low, _ = procs.ephemeral_range()
    ports = procs.free_ports(12)
    assert len(set(ports)) == 12
    assert all(procs.PORT_FLOOR <= p < low for p in ports), ports
    for p in ports:  # free now that the probe released them
        with socket.socket() as s:
            s.bind((procs.LOCALHOST, p))


def test_a_port_in_use_is_never_chosen_and_port_0_is_the_last_resort(monkeypatch):
    with socket.socket() as held:
        held.bind((procs.LOCALHOST, 0))
        held.listen()
        taken = held.getsockname()[1]
        # a "range" of exactly that one port below the floor: too small, so the kernel chooses
        monkeypatch.setattr(port_choice, "ephemeral_range", lambda: (procs.PORT_FLOOR + 10, 60999))
        ports = procs.free_ports(3)
        assert len(set(ports)) == 3 and taken not in ports


def test_the_range_comes_from_the_kernel_or_a_default(tmp_path):
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert procs.ephemeral_range(f) == (40000, 50000)
    assert procs.ephemeral_range(tmp_path / "none") == (32768, 60999)


def test_a_port_is_never_handed_out_twice_by_one_process(monkeypatch):
    """`levers9 up` chooses every server's ports before any server binds them: a port chosen for
    weed must not be chosen again for NATS meanwhile. In a pool of 1,000 ports, 100 draws of 8
    would repeat one almost surely without the ledger."""
    monkeypatch.setattr(port_choice, "HANDED", {})
    monkeypatch.setattr(port_choice, "ephemeral_range", lambda: (procs.PORT_FLOOR + 1000, 60999))
    drawn = [p for _ in range(100) for p in procs.free_ports(8)]  # each released at once, unbound
    assert len(set(drawn)) == len(drawn)


def test_an_earlier_runs_port_is_claimed_once():
    port = procs.free_port()
    assert not procs.claim_port(port)  # handed out just now
    fresh = max(port_choice.HANDED) + 1
    while fresh in port_choice.HANDED:
        fresh += 1
    assert procs.claim_port(fresh) and not procs.claim_port(fresh)


def test_a_handed_out_port_may_be_handed_out_again_after_the_hold(monkeypatch):
    monkeypatch.setattr(port_choice, "HANDED", {})
    port = procs.free_port()
    assert not procs.claim_port(port)
    port_choice.HANDED[port] -= port_choice.HOLD_S + 1  # as if handed out long ago
    assert procs.claim_port(port)
    assert list(port_choice.HANDED) == [port]
