"""The embedded stack: the CLI's process supervisor for `levers9 up`, `status` and `down`.

    supervisor.py                     Stack: servers and services of one home, up/down/status
    nats_server.py postgres.py s3.py  one launcher per server
    registry.py                       (and the OCI registry's)
    home.py                           a home's logs, pid files, state file, lock; starting a process
    procs.py                          ports, probes, signals, binaries

Only the CLI, the tests and the benchmarks use it; services never import it.
"""

from .home import SERVERS, URL_KEYS
from .postgres import DATABASE, pg_bin
from .procs import LOCALHOST, StackError, binary, free_port, free_ports
from .supervisor import ComponentStatus, Stack

__all__ = ["DATABASE", "LOCALHOST", "SERVERS", "URL_KEYS", "ComponentStatus", "Stack", "StackError", "binary",
           "free_port", "free_ports", "pg_bin"]
