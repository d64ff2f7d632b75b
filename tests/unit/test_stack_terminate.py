"""terminate_all: a stopped parent's children are killed with it, except the ones the caller spares.

`levers9 down` stops the pool controller and then its workers (its children) gracefully; before
`spare` existed they were SIGKILLed two seconds after their parent and left their containers,
mounts and network namespaces behind."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from levers9.stack.procs import terminate_all

# a parent that starts two sleeping children, prints their pids and waits for SIGTERM
PARENT = """
import signal, subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
print(" ".join(str(k.pid) for k in kids), flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
time.sleep(60)
"""


def start_family() -> tuple[subprocess.Popen, list[int]]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    kids = [int(p) for p in parent.stdout.readline().split()]
    return parent, kids


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_children_die_with_their_parent_unless_spared():
    parent, (killed, spared) = start_family()
    try:
        terminate_all([parent.pid], 15, timeout=10, spare=frozenset({spared}))
        parent.wait(5)
        deadline = time.monotonic() + 5
        while alive(killed) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(killed)
        assert alive(spared)
    finally:
        for pid in (killed, spared):
            if alive(pid):
                psutil.Process(pid).kill()


def test_what_ignores_sigterm_past_the_timeout_is_killed_and_named():
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    polite = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        for p in (stubborn, polite):
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"  # its handler is set
        assert terminate_all([stubborn.pid, polite.pid], 15, timeout=1) == [stubborn.pid]
        assert not alive(stubborn.pid) and not alive(polite.pid)
    finally:
        for p in (stubborn, polite):
            if p.poll() is None:
                p.kill()
