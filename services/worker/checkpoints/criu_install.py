"""CRIU for the worker: a CRIU >= 4.2 that works on this kernel, found or made once per machine.

Why not just the distro's: Debian 12's criu 3.17.1 fails on newer kernels ("vdso: Unexpected rt
vDSO area bounds" in every command). Debian 13's criu 4.1.1 passes `criu check` but cannot dump
any process holding an inet socket on Linux >= 6.16 (the kernel restricted SO_PASSCRED/SO_PASSSEC
to unix/netlink sockets: "sockets: Can't get 1:16 opt: Operation not supported"; CRIU issue 2705,
fixed in 4.2), and it segfaults when runc's CRIU config file sets `network-lock` (also fine in
4.2). Every endpoint listens on TCP, so 4.2 is the floor. A package newer than the host's Debian
must never be installed into the host (it drags in a newer libc), so:

1. a `criu` on PATH (or in /usr/sbin, /sbin) of version >= 4.2 that passes `criu check` AND a real
   dump of a small process listening on TCP is used as it is (newer hosts);
2. otherwise a private Debian root `<cache_dir>/criu/<suite>` is made once per machine
   (`debootstrap --variant=minbase --include=criu <suite>`, from the mirror of this machine's own
   apt sources, built in a temporary dir and renamed into place under an fcntl lock), and the
   wrapper script `<cache_dir>/criu/criu` runs that root's criu with that root's own loader and
   libraries. The suite is Debian testing: Debian 13 (trixie) has only 4.1.1 and no backport.

runc calls CRIU as `<binary> swrk <fd>` (the RPC worker; runc also asks its version through the
RPC). The wrapper passes its arguments unchanged (`swrk` must stay argv[1]) and `exec`s, so the
RPC socket fd and the fds runc hands over (--inherit-fd) reach CRIU as they are. Programs CRIU runs
itself (tar for tmpfs contents, ...) are the host's: the library path is not in the environment.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from levers9.worker.runtime.runc import rootfs

SUITE = "testing"  # Debian 13's 4.1.1 is too old (module docstring); testing has 4.2.1
MIN_VERSION = (4, 2)
LOADER = "lib64/ld-linux-x86-64.so.2"
LIBRARY_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu")
SEARCH_PATH = ":/usr/local/sbin:/usr/sbin:/sbin"
Progress = Callable[[str], None]


class CriuUnavailable(RuntimeError):
    """No working CRIU >= 4 here; the message says why in a sentence."""


@dataclass(frozen=True)
class CriuInfo:
    binary: Path  # what runc gets as --criu: the distro criu or our wrapper script
    version: str  # "4.1.1"
    check: str  # the last line of `criu check` ("Looks good.")


# ---- pure ----------------------------------------------------------------------------------------

def parse_version(text: str) -> tuple[int, ...] | None:
    """(4, 1, 1) from `criu --version` output ("Version: 4.1.1\\n..."), None if there is none."""
    match = re.search(r"Version:\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def check_passed(text: str) -> bool:
    return "Looks good" in text


def wrapper_script(root: Path) -> str:
    """The shell script that runs `root`'s criu with `root`'s loader and libraries."""
    libs = shlex.quote(":".join(str(root / d) for d in LIBRARY_DIRS))
    loader, binary = shlex.quote(str(root / LOADER)), shlex.quote(str(root / "usr/sbin/criu"))
    return ("#!/bin/sh\n"
            "# levers9: a newer Debian's CRIU from a private root (see levers9.worker.checkpoints.criu_install)\n"
            f"exec {loader} --library-path {libs} {binary} \"$@\"\n")


def private_root(cache_dir: Path) -> Path:
    return Path(cache_dir) / "criu" / SUITE


def wrapper_path(cache_dir: Path) -> Path:
    return Path(cache_dir) / "criu" / "criu"


# ---- finding and making --------------------------------------------------------------------------

async def ensure_criu(cache_dir: Path, progress: Progress = lambda s: None) -> CriuInfo:
    """A working CRIU >= 4.2 (see the module docstring); CriuUnavailable with the reason otherwise.

    The first call on a machine without one builds the private root (about a minute)."""
    distro = shutil.which("criu", path=os.environ.get("PATH", "") + SEARCH_PATH)
    why_not_distro = "no criu is installed"
    if distro:
        info, why_not_distro = await _probe(Path(distro))
        if info:
            progress(f"using the installed CRIU {info.version} at {distro}")
            return info
    loop = asyncio.get_running_loop()

    def threadsafe(line: str) -> None:
        loop.call_soon_threadsafe(progress, line)

    try:
        wrapper = await asyncio.to_thread(ensure_private_criu, Path(cache_dir), threadsafe)
    except (rootfs.RootfsError, OSError) as exc:
        raise CriuUnavailable(f"{why_not_distro}, and Debian {SUITE}'s CRIU could not be set up: "
                              f"{exc}") from exc
    info, why = await _probe(wrapper)
    if not info:
        raise CriuUnavailable(f"{why_not_distro}, and Debian {SUITE}'s CRIU ({wrapper}) does not work "
                              f"here: {why}")
    progress(f"using Debian {SUITE}'s CRIU {info.version} through {wrapper}")
    return info


async def _probe(binary: Path) -> tuple[CriuInfo | None, str]:
    """(info, "") when `binary` is CRIU >= 4.2, `check` passes and it can dump a process with a
    listening TCP socket; (None, why) otherwise."""
    rc, out = await run_bounded(str(binary), "--version")
    version = parse_version(out)
    if rc != 0 or version is None:
        return None, f"{binary} --version failed: {_tail(out)}"
    shown = ".".join(map(str, version))
    if version < MIN_VERSION:
        return None, (f"{binary} is CRIU {shown}, older than "
                      f"{'.'.join(map(str, MIN_VERSION))} (it cannot dump TCP sockets on newer kernels)")
    rc, out = await run_bounded(str(binary), "check")
    if rc != 0 or not check_passed(out):
        return None, f"`{binary} check` did not pass: {_tail(out)}"
    why = await asyncio.to_thread(probe_dump, binary)
    if why:
        return None, why
    return CriuInfo(binary=binary, version=shown, check=_tail(out, 1)), ""


# a process like every endpoint: a listening TCP socket (what `criu check` does not try)
_LISTENER = ("import socket, sys, time\n"
             "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
             "open(sys.argv[1], 'w').close()\n"
             "time.sleep(60)\n")


def probe_dump(binary: Path, timeout: float = 30) -> str:
    """"" when `binary` dumps (leave-running) a small process listening on TCP; else why not."""
    with tempfile.TemporaryDirectory(prefix="levers9-criu-probe-") as tmp:
        ready = Path(tmp) / "ready"
        images = Path(tmp) / "images"
        images.mkdir()
        child = subprocess.Popen([sys.executable, "-c", _LISTENER, str(ready)], cwd=tmp,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 10
            while not ready.exists():
                if child.poll() is not None or time.monotonic() > deadline:
                    return "the probe process for a test dump did not start"
                time.sleep(0.01)
            try:
                done = subprocess.run([str(binary), "dump", "--tree", str(child.pid), "--leave-running",
                                       "--images-dir", str(images), "--log-file", "dump.log"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, timeout=timeout)
            except subprocess.TimeoutExpired:
                return f"a test dump with {binary} took longer than {timeout:.0f} s"
            if done.returncode != 0:
                errors = [line.split(": ", 1)[-1] for line in _read(images / "dump.log").splitlines()
                          if "Error" in line and "RLIMIT_NOFILE" not in line]
                return (f"{binary} cannot dump a process listening on TCP here: "
                        f"{'; '.join(errors[:3]) or _tail(done.stdout.decode(errors='replace'))}")
            return ""
        finally:
            child.kill()
            child.wait()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


async def run_bounded(*cmd: str, timeout: float = 60) -> tuple[int, str]:
    """(exit code, stdout+stderr) of a command that may not run longer than `timeout` (124 then)."""
    try:
        proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
    except OSError as exc:
        return 127, str(exc)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return 124, f"timed out after {timeout:.0f} s"
    return proc.returncode or 0, out.decode(errors="replace")


def _tail(text: str, lines: int = 3) -> str:
    # CRIU prints harmless warnings ("Can't keep kdat cache on non-tempfs") before its verdict
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:]) or "(no output)"


def ensure_private_criu(cache_dir: Path, progress: Progress = lambda s: None) -> Path:
    """The wrapper of the private Debian CRIU, building its root first if needed (blocking)."""
    root = private_root(cache_dir)
    wrapper = wrapper_path(cache_dir)
    root.parent.mkdir(parents=True, exist_ok=True)
    script = wrapper_script(root)
    if _complete(root) and wrapper.is_file() and wrapper.read_text() == script:
        return wrapper
    with open(root.parent / f".{SUITE}.lock", "w") as lock:
        if not rootfs.try_lock(lock):
            progress(f"waiting for another worker to build {root}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not _complete(root):  # else built by whoever held the lock
            _build(root, progress)
        if not wrapper.is_file() or wrapper.read_text() != script:
            tmp = wrapper.with_name(f".criu.{os.getpid()}.tmp")
            tmp.write_text(script)
            tmp.chmod(0o755)
            os.replace(tmp, wrapper)
    return wrapper


def _complete(root: Path) -> bool:
    return (root / "usr/sbin/criu").is_file() and (root / LOADER).exists()


def _build(root: Path, progress: Progress) -> None:
    for stale in root.parent.glob(f".{SUITE}.build-*"):  # a crashed build (we hold the lock)
        rootfs._remove_build(stale)
    if root.exists():  # incomplete: not ours to trust
        rootfs._remove_build(root)
    tmp = root.parent / f".{SUITE}.build-{os.getpid()}"
    try:
        _debootstrap(tmp, rootfs.host_mirror(), progress)
        os.rename(tmp, root)
    except BaseException:
        rootfs._remove_build(tmp)
        raise


def _debootstrap(target: Path, mirror: str, progress: Progress) -> None:
    # the mirror serving this machine's release serves the newer suites too (same archive)
    progress(f"building a private Debian {SUITE} root with CRIU from {mirror} (once per machine)")
    started = time.monotonic()
    rootfs.debootstrap(SUITE, ("criu",), target, mirror, progress)
    progress(f"private Debian {SUITE} root built in {time.monotonic() - started:.0f} s")

