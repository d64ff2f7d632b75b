"""One levers9 home on disk: its logs, pid files, state file and lock, and how a process is started in it.

    home/logs/NAME.log      one log per component, appended to
    home/run/NAME.pid       the pid of each process we started
    home/state.json         URLs, pids and ports of what runs now

Also the two types a server launcher deals in: `Launch` (a process just started, and how to tell it is
ready) and `Server` (what the supervisor needs to know about one kind of server).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple

from levers9.runtime.config import SERVICES

from .procs import Progress, StackError, log_tail, port_taken

if TYPE_CHECKING:
    from levers9.runtime.config import Settings

SERVERS = ("nats", "postgres", "s3", "registry")
# what `levers9 up` starts after the servers: the six services, and the dashboard (a client of the
# gateway like any other: no database or bus credentials, levers9.dashboard)
PROCESSES = (*SERVICES, "dashboard")
# the Settings field (and so LEVERS9_<KEY>) that names each server; the registry's is host:port
URL_KEYS = {"nats": "nats_url", "postgres": "database_url", "s3": "s3_endpoint", "registry": "registry"}

# Popen objects of the processes we started, so they are reaped and never warn when collected.
CHILDREN: dict[int, subprocess.Popen] = {}


class Account(NamedTuple):
    """The user a server runs as, when not the caller (postgres refuses to run as root)."""
    uid: int
    gid: int


class Launch(NamedTuple):
    """A server process just started, and how to tell it is ready."""
    name: str
    proc: subprocess.Popen
    log_offset: int
    entry: dict
    ready: Callable[[], bool]


@dataclass(frozen=True)
class Server:
    """One kind of server the stack starts: how to launch it, recognise it, probe it and stop it."""
    name: str
    launch: Callable[["Home", "Settings", Progress], Launch]
    marker: Callable[[Path], str]  # the argument only this home's server has on its command line
    probe: Callable[[str, "dict | None"], bool]  # (its url, its state entry when we started it)
    stop_signal: int = signal.SIGTERM
    max_stop_timeout: float | None = None
    after_ready: Callable[[Launch, Progress], None] | None = None
    cleanup: Callable[[Path, dict], None] | None = None  # what only a running server needs, after down
    # whether a running server's state entry says it was started as this code starts it (with this
    # stack's credentials); one started by an older levers9 is restarted by `up`
    current: Callable[[dict], bool] = lambda entry: True

    @property
    def url_key(self) -> str:
        return URL_KEYS[self.name]

    def stop_timeout(self, default: float) -> float:
        return default if self.max_stop_timeout is None else min(default, self.max_stop_timeout)


class Home:
    """The directory everything of one stack lives in."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path).expanduser().absolute()
        self._lock_depth = 0
        self._lock_file: int | None = None

    def log_path(self, name: str) -> Path:
        return self.path / "logs" / f"{name}.log"

    def pid_path(self, name: str) -> Path:
        return self.path / "run" / f"{name}.pid"

    @property
    def state_path(self) -> Path:
        return self.path / "state.json"

    def read_state(self) -> dict:
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            state = {}
        state.setdefault("components", {})
        return state

    def write_state(self, state: dict) -> None:
        for name, key in (*URL_KEYS.items(), ("gateway", "gateway_url")):
            state[key] = state["components"].get(name, {}).get("url", "")
        tmp = self.state_path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the admin's DSN is in it
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(state, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.state_path)

    def record(self, name: str, entry: dict) -> None:
        state = self.read_state()
        state["components"][name] = entry
        self.write_state(state)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One `up`/`down` at a time per home; re-entrant within this object."""
        if self._lock_depth == 0:
            self.restrict()
            for sub in ("logs", "run"):
                (self.path / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
                (self.path / sub).chmod(0o700)
            self._lock_file = os.open(self.path / "run" / "stack.lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        self._lock_depth += 1
        try:
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0 and self._lock_file is not None:
                os.close(self._lock_file)  # closing releases the flock
                self._lock_file = None

    def restrict(self) -> None:
        """The home is its owner's alone (0700): user code, logs, data and credentials live here. At
        most its group may pass through (0710), when postgres runs as a system user of that group
        (postgres.py gives the home to it): nobody else can even look inside."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = self.path.stat()
        try:
            given = st.st_gid != pwd.getpwuid(st.st_uid).pw_gid  # to a group other than its owner's own
        except KeyError:
            given = False
        allowed = 0o710 if given else 0o700
        if st.st_mode & 0o777 & ~allowed:
            self.path.chmod(st.st_mode & allowed)

    # ---- starting a process ------------------------------------------------------------------

    def spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
              account: Account | None = None) -> tuple[subprocess.Popen, int]:
        """Start `cmd` in its own session, logging to logs/NAME.log; returns it and its log offset.
        Its own session: it outlives the command that started it."""
        with self.log_path(name).open("ab") as log:
            offset = log.tell()
            log.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} levers9 starts: {' '.join(cmd)}\n"
                      .encode())
            log.flush()
            ids: dict = {"user": account.uid, "group": account.gid, "extra_groups": []} if account else {}
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    cwd=self.path, **ids)
        CHILDREN[proc.pid] = proc
        self.pid_path(name).write_text(f"{proc.pid}\n")
        return proc, offset

    def wait_ready(self, name: str, proc: subprocess.Popen, offset: int, ready: Callable[[], bool],
                   timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay, last = 0.02, "no answer"
        while True:
            if proc.poll() is not None:
                raise self.start_error(name, f"it exited with code {proc.returncode}", offset)
            try:
                if ready():
                    return
            except Exception as err:  # noqa: BLE001 - not ready yet, whatever the probe says ("starting up", refused)
                last = f"{type(err).__name__}: {err}"
            if time.monotonic() > deadline:
                raise self.start_error(name, f"it did not get ready within {timeout:.0f} s "
                                             f"(last check: {last})", offset)
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def start_error(self, name: str, why: str, offset: int) -> StackError:
        log = self.log_path(name)
        tail = log_tail(log, offset)
        if port_taken(tail):
            todo = "a port it needed was taken meanwhile; run `levers9 up` again, it picks new ports."
        else:
            todo = f"fix the cause shown above (full log: {log}) and run `levers9 up` again."
        return StackError(f"{name} did not start: {why}. Last lines of {log}:\n{tail}\n"
                          f"What to do: {todo}")
