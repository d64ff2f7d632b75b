"""The base root file system of runc containers: Debian bookworm (minbase) with python3.

Built once per machine with debootstrap into `<image_cache>/rootfs/bookworm-python3-base` and shared by
every worker of the machine as the read-only lower layer of each container's overlay. The build runs
in a temporary directory next to the final one and is renamed into place, so a reader sees either
no root or a complete one; an fcntl lock keeps two workers from building it at the same time.

The Debian mirror comes from the machine's own apt sources (never a host name written here): the
first source that serves the `bookworm` suite with the `main` component.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

SUITE = "bookworm"
# pip and venv so that image builds can add packages; numpy and pandas (Debian's) because the
# popular imports are what checkpoints pay off on and one root per machine keeps set-up short
PACKAGES = ("python3", "python3-pip", "python3-venv", "python3-numpy", "python3-pandas")
BASE_NAME = f"{SUITE}-python3-base"
# what containers do not need: package lists, docs, man pages, translations
STRIP = ("var/lib/apt/lists", "var/cache/apt", "usr/share/doc", "usr/share/man", "usr/share/info",
         "usr/share/locale", "usr/share/lintian")
# mount points of every container, made in the base so the overlay's upper layer stays small
MOUNT_POINTS = ("app", "opt/levers9", "var/log/levers9")


class RootfsError(RuntimeError):
    pass


# ---- the mirror, from apt sources (pure) ---------------------------------------------------------

def mirror_from_sources(files: Iterable[tuple[str, str]], suite: str = SUITE,
                        component: str = "main") -> str | None:
    """The first `deb` URI serving `suite` with `component`, from (file name, text) pairs in order.

    `*.list` files are one-line-style (`deb [opts] URI SUITE COMPONENT…`), `*.sources` files are
    deb822 stanzas (`Types:`, `URIs:`, `Suites:`, `Components:`, `Enabled:`).
    """
    for name, text in files:
        entries = _deb822_entries(text) if name.endswith(".sources") else _one_line_entries(text)
        for uris, suites, components in entries:
            if suite in suites and component in components and uris:
                return uris[0]
    return None


def _one_line_entries(text: str) -> list[tuple[list[str], list[str], list[str]]]:
    entries = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        line = re.sub(r"\[[^\]]*\]", " ", line)  # [arch=amd64 signed-by=…] options
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "deb":
            entries.append(([parts[1]], [parts[2]], parts[3:]))
    return entries


def _deb822_entries(text: str) -> list[tuple[list[str], list[str], list[str]]]:
    entries = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for raw in stanza.splitlines():
            if raw.lstrip().startswith("#"):
                continue
            if raw[:1] in (" ", "\t") and key:  # a continuation line
                fields[key] += " " + raw.strip()
                continue
            if ":" in raw:
                key, value = raw.split(":", 1)
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        entries.append((fields.get("uris", "").split(), fields.get("suites", "").split(),
                        fields.get("components", "").split()))
    return entries


def host_mirror(etc_apt: Path = Path("/etc/apt"), suite: str = SUITE) -> str:
    """The mirror of `suite` from this machine's apt sources; RootfsError when none serves it."""
    files: list[Path] = []
    if (etc_apt / "sources.list").is_file():
        files.append(etc_apt / "sources.list")
    parts = etc_apt / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources") and p.is_file())
    mirror = mirror_from_sources((p.name, p.read_text(errors="replace")) for p in files)
    if not mirror:
        raise RootfsError(f"no apt source of this machine serves '{suite} main' "
                          f"(looked in {etc_apt}/sources.list and {etc_apt}/sources.list.d/)")
    return mirror


# ---- the build (imperative) ----------------------------------------------------------------------

def base_rootfs_path(cache_dir: Path) -> Path:
    return Path(cache_dir) / "rootfs" / BASE_NAME


def ensure_base_rootfs(cache_dir: Path, progress: Callable[[str], None] = lambda s: None) -> Path:
    """The base root's path, built first if this machine has none yet (blocking; minutes once).

    `progress` gets one line per step (debootstrap's own `I:` lines included).
    """
    final = base_rootfs_path(cache_dir)
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f"{BASE_NAME}.lock", "w") as lock:
        if not try_lock(lock):
            progress(f"waiting for another worker to build {final}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():  # built by whoever held the lock
            return final
        _remove_stale_builds(final.parent)
        tmp = final.parent / f".{BASE_NAME}.build-{os.getpid()}"
        try:
            _debootstrap(tmp, host_mirror(), progress)
            _strip(tmp)
            _configure(tmp)
            for mount_point in MOUNT_POINTS:
                (tmp / mount_point).mkdir(parents=True, exist_ok=True)
            os.rename(tmp, final)
        except BaseException:
            _remove_build(tmp)
            raise
    return final


def try_lock(lock) -> bool:
    """Take an exclusive flock on `lock` without waiting; False when another process holds it."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _debootstrap(target: Path, mirror: str, progress: Callable[[str], None]) -> None:
    progress(f"building the base root file system ({SUITE} + python3) from {mirror}")
    started = time.monotonic()
    debootstrap(SUITE, PACKAGES, target, mirror, progress)
    progress(f"base root file system built in {time.monotonic() - started:.0f} s")


def debootstrap(suite: str, packages: tuple[str, ...], target: Path, mirror: str,
                progress: Callable[[str], None]) -> None:
    """A Debian minbase root of `suite` with `packages` in `target`, debootstrap's steps reported
    through `progress`; RootfsError with the tail of its output when it fails."""
    exe = shutil.which("debootstrap", path=os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin")
    if not exe:
        raise RootfsError("debootstrap is not installed (apt-get install debootstrap)")
    cmd = [exe, "--variant=minbase", f"--include={','.join(packages)}", suite, str(target), mirror]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        if line.startswith(("I: Retrieving", "I: Validating", "I: Extracting", "I: Installing",
                            "I: Configuring", "I: Base system", "E:", "W:")):
            progress(line)
    if proc.wait() != 0:
        raise RootfsError(f"debootstrap {suite} failed ({proc.returncode}): " + "\n".join(tail))


def _strip(root: Path) -> None:
    for rel in STRIP:
        path = root / rel
        if path.is_dir():
            for child in path.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
    for cached in (root / "var/cache/debconf").glob("*-old"):
        cached.unlink(missing_ok=True)


def _configure(root: Path) -> None:
    """No trace of the build host: debootstrap copies its resolver and host name."""
    (root / "etc/resolv.conf").write_text("# levers9: no DNS; containers reach only their bridge subnet\n")
    (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost\n")
    (root / "etc/hostname").write_text("levers9\n")
    # image builds pip-install into the system Python (/usr/local): no PEP 668 refusal there
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()


def _remove_stale_builds(parent: Path) -> None:
    """Builds left by a crashed worker (we hold the lock, so nobody is building now)."""
    for stale in parent.glob(f".{BASE_NAME}.build-*"):
        _remove_build(stale)


def _remove_build(path: Path) -> None:
    # debootstrap mounts proc and sys inside its target: unmount before deleting anything there
    for mount_point in sorted(_mounts_under(path), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount_point], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    if _mounts_under(path):
        raise RootfsError(f"cannot remove {path}: something is still mounted under it")
    shutil.rmtree(path, ignore_errors=True)


def _mounts_under(path: Path) -> list[str]:
    prefix = str(Path(path).resolve()) if Path(path).exists() else str(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mount_point = line.split()[4].replace("\\040", " ")
            if mount_point == prefix or mount_point.startswith(prefix + "/"):
                found.append(mount_point)
    return found
