"""A deploy's code archive, looked into before it is stored: a tenant's archive is read with limits.

It is read as a stream (never seeking: a seek in a gzip stream decompresses everything before it),
member by member, counting what comes out of the decompressor: more than MAX_ENTRIES members or
more than MAX_UNPACKED_BYTES unpacked is refused (413 naming the limit) as soon as it is seen, so
a 1 MB archive of 1 GiB of zeros costs a header, not a gibibyte. Every member's path must stay in
the archive's tree (no absolute path, no `..`, no link out of it) and be a file, a directory or a
link (no device, no fifo). Blocking: the gateway runs it in a thread, one archive at a time per
slot (INSPECTIONS), so its event loop keeps answering meanwhile.
"""

from __future__ import annotations

import gzip
import io
import posixpath
import tarfile
import zlib
from dataclasses import dataclass

MAX_ENTRIES = 20_000
MAX_UNPACKED_BYTES = 256 << 20
MAX_NAME_CHARS = 1024


@dataclass(frozen=True)
class Verdict:
    status: int = 0  # 0: fine; 413: over a limit; 422: not a code archive we run
    problem: str = ""
    names: frozenset[str] = frozenset()


class _OverLimit(Exception):
    pass


class _Counted:
    """The decompressed stream, counted: _OverLimit once more than `limit` bytes came out (tarfile's
    stream mode only calls read())."""

    def __init__(self, inner: io.BufferedIOBase, limit: int):
        self.inner, self.limit, self.seen = inner, limit, 0

    def read(self, size: int = 1 << 16) -> bytes:
        chunk = self.inner.read(min(size, 1 << 20) if size >= 0 else 1 << 16)
        self.seen += len(chunk)
        if self.seen > self.limit:
            raise _OverLimit
        return chunk


def path_problem(member: tarfile.TarInfo) -> str:
    """Why this member's path or kind is not acceptable in a code archive ("" when it is)."""
    name = member.name
    shown = repr(name[:80])
    if len(name) > MAX_NAME_CHARS:
        return f"the code archive has an entry whose name is over {MAX_NAME_CHARS} characters"
    if name.startswith("/") or "\\" in name:
        return f"the code archive's entry {shown} is an absolute path: archive paths relative to your project"
    if ".." in name.split("/"):
        return f"the code archive's entry {shown} leads out of the archive ('..')"
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return f"the code archive's entry {shown} is a device or a fifo: archive files and directories only"
    if member.issym() or member.islnk():
        target = member.linkname
        base = posixpath.dirname(name) if member.issym() else ""
        resolved = posixpath.normpath(posixpath.join(base, target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            return f"the code archive's link {shown} points out of the archive"
    return ""


def _over(what: str, limit: str) -> Verdict:
    return Verdict(413, f"the code archive {what}; the limit is {limit}: deploy less (large data belongs in an "
                        "image or a volume)")


def inspect_code(data: bytes, max_entries: int = MAX_ENTRIES, max_unpacked: int = MAX_UNPACKED_BYTES) -> Verdict:
    """Look through a tar.gz within the limits: its member names, or why it is refused."""
    names: set[str] = set()
    declared = 0
    size = f"{max_unpacked >> 20} MiB" if max_unpacked >= 1 << 20 else f"{max_unpacked} bytes"
    try:
        raw = _Counted(gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb"), max_unpacked)
        with tarfile.open(fileobj=raw, mode="r|", bufsize=1 << 16) as tar:  # type: ignore[call-overload]
            for count, member in enumerate(tar, start=1):
                if count > max_entries:
                    return _over(f"has more than {max_entries} entries", f"{max_entries} entries")
                declared += member.size
                if declared > max_unpacked:
                    return _over(f"unpacks to more than {size}", f"{size} unpacked")
                problem = path_problem(member)
                if problem:
                    return Verdict(422, problem)
                names.add(member.name.removeprefix("./"))
    except _OverLimit:
        return _over(f"unpacks to more than {size}", f"{size} unpacked")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        return Verdict(422, f"the code archive is not a tar.gz ({type(exc).__name__}): make it with "
                            "`tar czf` or let `levers9 deploy` package it")
    return Verdict(names=frozenset(names))


def archive_problem(data: bytes, module: str) -> tuple[int, str]:
    """(status, why) this code archive cannot run `module`; (0, "") when it can."""
    verdict = inspect_code(data)
    if verdict.status:
        return verdict.status, verdict.problem
    if module and f"{module}.py" not in verdict.names:  # a box names no module: its command is its code
        listed = ", ".join(sorted(verdict.names)[:10])
        return 422, f"the code archive has no {module}.py (it has: {listed})"
    return 0, ""
