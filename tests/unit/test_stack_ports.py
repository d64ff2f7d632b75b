"""The stack's servers get ports below the kernel's ephemeral range, so an outgoing connection cannot
take one between choosing it and the server's bind."""

from __future__ import annotations

import os
import socket
import time

import pytest

from levers9.runtime import ports as port_choice
from levers9.stack import procs


@pytest.fixture(autouse=True)
def own_ledger(monkeypatch, tmp_path):
    """The machine's ledger is shared with every other process here (a second suite beside this one
    draws from the same small pools these tests make): each test gets a folder of its own."""
    monkeypatch.setattr(port_choice, "LEDGER", tmp_path / "ledger")
    return tmp_path / "ledger"


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
    port_choice.HANDED[port] -= port_choice.HOLD_S + 1  # as if handed out long ago ...
    assert not procs.claim_port(port)  # ... by this process: the machine's ledger still holds it
    long_ago = time.time() - port_choice.HOLD_S - 1
    os.utime(port_choice.LEDGER / str(port), (long_ago, long_ago))
    assert procs.claim_port(port)
    assert list(port_choice.HANDED) == [port]


def test_a_port_another_process_handed_out_lately_is_not_chosen(monkeypatch, own_ledger):
    """The ledger is the machine's: another process (a second pytest lane, a second `levers9 up`, a
    worker) that chose a port whose server has not bound it yet keeps it for HOLD_S."""
    monkeypatch.setattr(port_choice, "HANDED", {})
    monkeypatch.setattr(port_choice, "ephemeral_range", lambda: (procs.PORT_FLOOR + 1000, 60999))
    own_ledger.mkdir()
    for p in range(procs.PORT_FLOOR, procs.PORT_FLOOR + 1000, 2):  # every even port: another process's
        (own_ledger / str(p)).touch()
    old = own_ledger / str(procs.PORT_FLOOR + 2)
    os.utime(old, (time.time() - port_choice.HOLD_S - 1,) * 2)  # ... this one long ago
    drawn = [p for _ in range(20) for p in procs.free_ports(8)]
    assert len(set(drawn)) == len(drawn)
    assert all(p % 2 == 1 or p == procs.PORT_FLOOR + 2 for p in drawn), drawn
    assert all((own_ledger / str(p)).exists() for p in drawn)  # and now this process's, for others


def test_a_port_another_process_claimed_lately_is_not_claimed(monkeypatch, own_ledger):
    monkeypatch.setattr(port_choice, "HANDED", {})
    own_ledger.mkdir()
    (own_ledger / "20077").touch()
    assert not procs.claim_port(20077)
