"""The corpus: real example code no one here wrote, fetched into a cache and split for the benchmark.

The default corpus is two sets of examples:
- scikit-learn's, from Debian's `python-sklearn-doc` (`apt-get download`, then `dpkg-deb -x`); the
  package ships them as plain .py under usr/share/doc/python-sklearn-doc/examples/ (and again, renamed,
  under html/_downloads/, which we skip so no file counts twice). A .py.gz there is decompressed.
- networkx's, the examples/ directory of its source distribution (`pip download --no-binary :all:`).

Each lands in its own directory under the cache (default $LEVERS9_HOME/corpus, else
~/.cache/levers9/corpus) and is reused when present: it is moved into place only once complete. Any
directory can be added. A deterministic hash of each file's path relative to its corpus directory
decides the held-out share, so the split is the same on every machine.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import msgspec

from levers9.runtime.safe_tar import extract_data

SKLEARN_DEB = "python-sklearn-doc"
SKLEARN_EXAMPLES = Path("usr/share/doc/python-sklearn-doc/examples")
NETWORKX_VERSION = "3.4.2"
FETCH_TIMEOUT_S = 300.0

Progress = Callable[[str], None]


class CorpusDir(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # "scikit-learn-examples", or the directory's own name for an added one
    path: str
    source: str = ""  # where it came from: "apt python-sklearn-doc 1.2.1+dfsg-1", "local"


class CorpusFetchError(RuntimeError):
    """The default corpus could not be fetched (no network, no apt, no mirror): the reason is the message."""


def default_cache_dir(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    if env.get("LEVERS9_HOME"):
        return Path(env["LEVERS9_HOME"]).expanduser() / "corpus"
    return Path.home() / ".cache" / "levers9" / "corpus"


def local_dir(path: Path) -> CorpusDir:
    path = path.expanduser().resolve()
    if not path.is_dir():
        raise CorpusFetchError(f"{path} is not a directory")
    return CorpusDir(name=path.name, path=str(path), source="local")


def fetch_default(cache_dir: Path, progress: Progress | None = None) -> list[CorpusDir]:
    """Both default corpora, fetched into cache_dir unless already there."""
    say = progress or (lambda _msg: None)
    cache_dir.mkdir(parents=True, exist_ok=True)
    return [fetch_sklearn(cache_dir, say), fetch_networkx(cache_dir, say)]


def fetch_sklearn(cache_dir: Path, say: Progress) -> CorpusDir:
    dest = cache_dir / "scikit-learn-examples"
    if not dest.is_dir():
        say(f"apt-get download {SKLEARN_DEB}")
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".fetch-") as tmp:
            _run(["apt-get", "download", SKLEARN_DEB], cwd=Path(tmp))
            debs = sorted(Path(tmp).glob(f"{SKLEARN_DEB}_*.deb"))
            if not debs:
                raise CorpusFetchError(f"apt-get download {SKLEARN_DEB} left no .deb")
            say(f"unpacking {debs[0].name}")
            unpack_deb_examples(debs[0], dest, SKLEARN_EXAMPLES)
            (dest / ".source").write_text(f"apt {debs[0].stem}")
    return CorpusDir(name=dest.name, path=str(dest), source=_source(dest))


def fetch_networkx(cache_dir: Path, say: Progress, version: str = NETWORKX_VERSION) -> CorpusDir:
    dest = cache_dir / "networkx-examples"
    if not dest.is_dir():
        say(f"pip download networkx=={version} (source)")
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".fetch-") as tmp:
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                  f"networkx=={version}", "-d", tmp], cwd=Path(tmp))
            sdists = sorted(Path(tmp).glob("networkx-*.tar.gz"))
            if not sdists:
                raise CorpusFetchError("pip download networkx left no source archive")
            unpack_sdist_examples(sdists[0], dest)
            (dest / ".source").write_text(f"pypi {sdists[0].name}")
    return CorpusDir(name=dest.name, path=str(dest), source=_source(dest))


def unpack_deb_examples(deb: Path, dest: Path, examples: Path) -> None:
    """dpkg-deb -x the package, then move its examples directory to dest (complete or not at all)."""
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".unpack-") as tmp:
        _run(["dpkg-deb", "-x", str(deb), tmp], cwd=Path(tmp))
        found = Path(tmp) / examples
        if not found.is_dir():
            raise CorpusFetchError(f"{deb.name} has no {examples}/")
        _gunzip_sources(found)
        found.rename(dest)


def unpack_sdist_examples(sdist: Path, dest: Path) -> None:
    """Extract only <top>/examples/ of a source archive into dest."""
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".unpack-") as tmp, tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if _in_examples(m.name) and (m.isfile() or m.isdir())]
        if not members:
            raise CorpusFetchError(f"{sdist.name} has no examples/ directory")
        extract_data(tar, tmp, members)
        top = Path(tmp) / members[0].name.split("/")[0] / "examples"
        _gunzip_sources(top)
        top.rename(dest)


def files(dirs: Iterable[CorpusDir]) -> list[Path]:
    """Every .py file under the directories, sorted, without duplicates (symlinks resolved)."""
    seen: dict[Path, None] = {}
    for d in dirs:
        for path in sorted(Path(d.path).rglob("*.py")):
            if path.is_file() and not any(part.startswith(".") for part in path.relative_to(d.path).parts):
                seen.setdefault(path.resolve(), None)
    return list(seen)


def split(paths: Sequence[Path], holdout: float, roots: Sequence[Path] = ()) -> tuple[list[Path], list[Path]]:
    """(train, held_out): a file is held out when the hash of its key falls below `holdout`.

    The key is the path relative to the first of `roots` containing it (so the split does not depend
    on where the cache is), else the whole path. Deterministic; the share is about `holdout`.
    """
    if not 0.0 <= holdout <= 1.0:
        raise ValueError(f"holdout must be within [0, 1], not {holdout}")
    train: list[Path] = []
    held: list[Path] = []
    for path in paths:
        (held if _fraction(_key(path, roots)) < holdout else train).append(path)
    return train, held


def _key(path: Path, roots: Sequence[Path]) -> str:
    for root in roots:
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return path.as_posix()


def _fraction(key: str) -> float:
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _in_examples(name: str) -> bool:
    parts = name.split("/")
    return len(parts) >= 2 and parts[1] == "examples"


def _gunzip_sources(root: Path) -> None:
    for gz in root.rglob("*.py.gz"):
        with gzip.open(gz, "rb") as src, open(gz.with_suffix(""), "wb") as out:
            shutil.copyfileobj(src, out)
        gz.unlink()


def _source(dest: Path) -> str:
    marker = dest / ".source"
    return marker.read_text().strip() if marker.is_file() else ""


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CorpusFetchError(f"{cmd[0]} failed: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise CorpusFetchError(f"`{' '.join(cmd)}` exited {proc.returncode}: {' / '.join(tail)}")
