"""The folder a container mounts read-only at /opt/levers9: one that holds the SDK package `levers9/`
(its runner and executor) and nothing else.

An editable install's `sdk/` is such a folder. An installed wheel's `levers9` sits in the venv's
site-packages beside every dependency of the platform, and its `levers9/` also holds the services
(gateway, worker, …): mounting that would let user code import the platform's packages (and see its
code), and an app that forgot a dependency would work here and fail elsewhere. Then the worker mounts
a copy made once per content under the home instead.

Either way the folder holds bytecode for this interpreter's Python beside the sources (`precompiled`):
the mount is read-only, so a container's Python could write no cache and compiled every module of the
runner and the executor at each start.
"""

from __future__ import annotations

import compileall
import hashlib
import shutil
from pathlib import Path

import levers9

# what an installed `levers9/` holds that the SDK folder does not: the platform's own packages
# (pyproject's package-dir maps them there); a container needs none of them
PLATFORM_PACKAGES = ("contracts", "runtime", "gateway", "scheduler", "pool_controller", "checkpoint_store",
                     "image_builder", "worker", "dashboard")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


def package_dir() -> Path:
    return Path(levers9.__file__).resolve().parent


def sdk_mount(home: Path) -> Path:
    """The folder to mount: the package's parent when it holds nothing else, else a copy under `home`."""
    package = package_dir()
    if _holds_only(package.parent, package.name) and not _platform_inside(package):
        return precompiled(package.parent)
    target = home / "sdk" / f"levers9-{_fingerprint(package)}"
    if not (target / "levers9" / "__init__.py").exists():
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(package, tmp / "levers9", ignore=_without_platform(package))
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            tmp.rename(target)
        except OSError:  # another worker of this machine made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return precompiled(target)


def precompiled(folder: Path) -> Path:
    """`folder`, with a `__pycache__/*.cpython-3XY.pyc` of this interpreter's version beside each of its
    modules (those already up to date are left as they are). Without them a sandbox's runner compiled
    about 60 modules at each start (bench_sandboxes: create + first output p50 584 ms without, 522-564
    ms with). A container whose Python is another version
    compiles in memory as before: the files are named per version and its own are never there."""
    compileall.compile_dir(folder, quiet=2, workers=1)  # nothing printed; a file it cannot write stays uncompiled
    return folder


def _holds_only(folder: Path, name: str) -> bool:
    return all(p.name in (name, "__pycache__") or p.name.startswith(".") for p in folder.iterdir())


def _platform_inside(package: Path) -> bool:
    return any((package / sub).is_dir() for sub in PLATFORM_PACKAGES)


def _without_platform(package: Path):
    def ignore(folder: str, names: list[str]) -> set[str]:
        skipped = set(IGNORED(folder, names))
        if Path(folder) == package:
            skipped |= set(PLATFORM_PACKAGES) & set(names)
        return skipped
    return ignore


def _fingerprint(package: Path) -> str:
    """Names, sizes and modification times of the SDK's files: a new install gets a new copy."""
    digest = hashlib.sha256()
    skip = {package / sub for sub in PLATFORM_PACKAGES}
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and not any(s in path.parents for s in skip):
            st = path.stat()
            digest.update(f"{path.relative_to(package)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]
