"""The image archive: a root fs packed once per content and unpacked back, and the chunk arithmetic
every range read relies on."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts.image_index import FileEntry, ImageIndex, chunk_bounds, chunk_span, decode_index
from levers9.runtime.image_archive import UnsafeIndex, chunk_ranges, unpack, write_archive


def make_tree(root: Path) -> dict[str, bytes]:
    """A small root fs; its regular files' contents by path."""
    contents = {
        "bin/tool": b"#!/bin/sh\necho hi\n",
        "usr/lib/big.bin": os.urandom(10_000),  # spans several chunks at chunk_size 1024
        "usr/lib/copy.bin": b"",  # filled below with big.bin's bytes: shares them in the archive
        "etc/empty": b"",
        "etc/conf": b"a=1\n",
    }
    contents["usr/lib/copy.bin"] = contents["usr/lib/big.bin"]
    for rel, data in contents.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    os.chmod(root / "bin/tool", 0o4755)
    os.chmod(root / "etc/conf", 0o600)
    os.link(root / "etc/conf", root / "etc/conf.hard")
    contents["etc/conf.hard"] = contents["etc/conf"]
    os.symlink("../usr/lib/big.bin", root / "bin/big")
    os.symlink("/nowhere/at/all", root / "etc/dangling")
    os.mkfifo(root / "etc/fifo")
    (root / "var/empty-dir").mkdir(parents=True)
    os.utime(root / "etc/conf", ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    return contents


def test_round_trip_keeps_contents_modes_links_and_times(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    contents = make_tree(src)
    archive, encoded, index = write_archive(src, "im-test", tmp_path / "archive", chunk_size=1024)
    assert decode_index(encoded) == index
    assert index.files[0].path == "" and [f.path for f in index.files] == sorted(f.path for f in index.files)
    # each distinct content once: big.bin and copy.bin share bytes, the hard link too, empties are free
    distinct = {hashlib.sha256(d).hexdigest(): len(d) for d in contents.values()}
    assert index.archive_size == archive.stat().st_size == sum(distinct.values())
    assert index.chunks == [hashlib.sha256(archive.read_bytes()[o:o + n]).hexdigest()
                            for _, o, n in chunk_ranges(index)]
    unpack(index, archive, dest)
    for rel, data in contents.items():
        assert (dest / rel).read_bytes() == data, rel
    for rel in ("bin/tool", "etc/conf", "var/empty-dir", "usr/lib", ""):
        a, b = os.lstat(src / rel), os.lstat(dest / rel)
        assert (stat.S_IMODE(a.st_mode), a.st_uid, a.st_gid, a.st_mtime_ns) == \
            (stat.S_IMODE(b.st_mode), b.st_uid, b.st_gid, b.st_mtime_ns), rel
    assert os.readlink(dest / "bin/big") == "../usr/lib/big.bin"
    assert os.readlink(dest / "etc/dangling") == "/nowhere/at/all"
    assert stat.S_ISFIFO(os.lstat(dest / "etc/fifo").st_mode)
    assert (dest / "etc/empty").stat().st_size == 0


def test_a_file_spanning_chunks_is_described_by_its_span(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    make_tree(src)
    archive, _, index = write_archive(src, "im-test", tmp_path / "archive", chunk_size=1024)
    big = next(f for f in index.files if f.path == "usr/lib/big.bin")
    span = chunk_span(big.offset, big.size, index.chunk_size)
    assert len(span) >= 10
    data = archive.read_bytes()
    joined = b"".join(data[o:o + n] for n in span for o, n in [chunk_bounds(n, index.chunk_size, index.archive_size)])
    start = big.offset - span.start * index.chunk_size
    assert hashlib.sha256(joined[start:start + big.size]).hexdigest() == big.sha256


def test_unpack_refuses_paths_that_leave_the_root(tmp_path):
    archive = tmp_path / "archive"
    archive.write_bytes(b"x")
    root = FileEntry(path="", kind="d", mode=0o755, uid=0, gid=0)
    for bad in ([root, FileEntry(path="../evil", kind="f", mode=0o644, uid=0, gid=0, size=1)],
                [root, FileEntry(path="link", kind="l", mode=0o777, uid=0, gid=0, target="/etc"),
                 FileEntry(path="link/passwd", kind="f", mode=0o644, uid=0, gid=0, size=1)]):
        index = ImageIndex(image_id="im-x", archive_sha256="", archive_size=1, chunks=[], files=bad)
        with pytest.raises(UnsafeIndex):
            unpack(index, archive, tmp_path / f"dest{len(list(tmp_path.iterdir()))}")
    assert not (tmp_path / "evil").exists()


@given(chunk_size=st.integers(1, 64), archive_size=st.integers(0, 2000), data=st.data())
def test_chunk_span_covers_exactly_the_chunks_a_range_touches(chunk_size, archive_size, data):
    count = -(-archive_size // chunk_size)
    bounds = [chunk_bounds(n, chunk_size, archive_size) for n in range(count)]
    # the chunks tile the archive
    assert [o for o, _ in bounds] == [sum(n for _, n in bounds[:i]) for i in range(count)]
    assert sum(n for _, n in bounds) == archive_size and all(n > 0 for _, n in bounds)
    offset = data.draw(st.integers(0, archive_size))
    length = data.draw(st.integers(0, archive_size - offset))
    span = chunk_span(offset, length, chunk_size)
    touched = [n for n, (o, size) in enumerate(bounds) if length and o < offset + length and offset < o + size]
    assert list(span) == touched
