"""A call's `packages=`: the requirements the sandbox lacks, installed with pip for this sandbox.

They go into PACKAGES_DIR/<key>, the key being a hash of the Python version and the requirements,
so every sandbox of the node that needs the same set shares one install (the worker binds one
directory per workspace: no sharing across tenants). An fcntl lock makes two sandboxes install
once; a marker file says the install finished (a directory without it is a killed install, redone).
The directory goes at the front of sys.path, so what it holds wins over the image's versions.
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import importlib
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

MARKER = ".levers9-installed"
PIP_TAIL_LINES = 12  # of pip's output, in the error of a failed install
_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(\[[^\]]*\])?\s*(.*)$", re.S)
_PIN = re.compile(r"==\s*([A-Za-z0-9._+!-]+)\s*(;.*)?$", re.S)


class InstallFailed(Exception):
    """pip failed (its last lines are the message), or the install was stopped."""


def canonical_name(name: str) -> str:
    """A project name as pip compares them (PEP 503): lowercase, runs of -_. become one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str | None:
    """The canonical project name of a requirement ("Foo_Bar[x]>=1; python_version>'3'" ->
    "foo-bar"); None when it names no project (a URL, a path, an option)."""
    return _split(requirement)[0]


def _split(requirement: str) -> tuple[str | None, str]:
    """(canonical name or None, what follows the name and extras)."""
    match = _NAME.match(requirement)
    if not match or requirement.lstrip().startswith(("-", ".", "/")):
        return None, ""
    rest = match.group(3).strip()
    if rest and rest[0] not in "<>=!~;(":
        # "git+https://..." or "pkg.tar.gz", not a bare name; "name @ url": what the URL holds
        # may differ from what is installed
        return None, ""
    return canonical_name(match.group(1)), rest


def is_present(requirement: str) -> bool:
    """True when the sandbox has the project (at the pinned version for `name==version`); other
    version ranges are not checked: standard library only, and the image's version usually fits."""
    import importlib.metadata  # here: ~50 ms of every sandbox's start for a call that may never come

    name, rest = _split(requirement)
    if name is None:
        return False
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    pin = _PIN.match(rest)
    return pin is None or dist.version == pin.group(1)


def missing(requirements: list[str]) -> list[str]:
    return sorted({r.strip() for r in requirements if r.strip() and not is_present(r.strip())})


def packages_key(requirements: list[str], python: tuple[int, int] | None = None) -> str:
    """The install directory's name: the same for the same Python major.minor and requirements."""
    major, minor = python or sys.version_info[:2]
    text = f"{major}.{minor}\n" + "\n".join(sorted(r.strip() for r in requirements))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure(requirements: list[str], base: Path, emit: Callable[[str], None],
           started: Callable[[subprocess.Popen], None], stopped: Callable[[], bool]) -> list[str]:
    """Install what the sandbox lacks of requirements; the list installed (empty: nothing to do).

    emit gets pip's output line by line; started gets pip's process (so a cancel can kill it);
    stopped says the call was cancelled (while waiting for another sandbox's install)."""
    need = missing(requirements)
    if not need:
        return []
    whole = base / packages_key(requirements)
    if (whole / MARKER).exists():  # the worker installed the whole set before the sandbox started
        add_to_path(whole)
        return need
    target = base / packages_key(need)
    if not (target / MARKER).exists():
        base.mkdir(parents=True, exist_ok=True)
        with _locked(base / f"{target.name}.lock", stopped):
            if not (target / MARKER).exists():  # another sandbox may have done it while we waited
                _pip_install(need, target, emit, started)
    add_to_path(target)
    return need


def add_to_path(target: Path) -> None:
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    importlib.invalidate_caches()  # the finders cached the directories before the install


def _pip_install(need: list[str], target: Path, emit: Callable[[str], None],
                 started: Callable[[subprocess.Popen], None]) -> None:
    shutil.rmtree(target, ignore_errors=True)  # what a killed install left
    command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
               "--progress-bar", "off", "--target", str(target), *need]
    emit(f"levers9: installing {' '.join(need)}\n")
    tail: collections.deque[str] = collections.deque(maxlen=PIP_TAIL_LINES)
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except OSError as exc:
        raise InstallFailed(f"pip could not start: {exc}") from None
    started(proc)
    assert proc.stdout is not None
    for line in proc.stdout:
        tail.append(line.rstrip("\n"))
        emit(line)
    code = proc.wait()
    if code != 0:
        if any("No module named pip" in line for line in tail):
            raise InstallFailed("this image has no pip: add pip to the image, or the packages themselves")
        raise InstallFailed("\n".join(tail) or f"pip exited with status {code}")
    (target / MARKER).write_text(" ".join(need) + "\n")


@contextmanager
def _locked(path: Path, stopped: Callable[[], bool]) -> Iterator[None]:
    """An exclusive flock on path, polled so that a cancelled call stops waiting."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if stopped():
                    raise InstallFailed("stopped while waiting for another install of the same packages") from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # releases the lock
