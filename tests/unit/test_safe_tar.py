"""A tenant's archive unpacks inside its folder or not at all, with PEP 706's data filter and without
it (Debian 12's python3 3.11.2, the container image's, has none)."""

from __future__ import annotations

import io
import stat
import tarfile

import pytest

from levers9.runtime import safe_tar
from levers9.runtime.safe_tar import UnsafeArchive, extract_data


def archive(*members: tuple[tarfile.TarInfo, bytes]) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    buf.seek(0)
    return tarfile.open(fileobj=buf, mode="r")


def entry(name: str, kind=tarfile.REGTYPE, linkname: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.uid, info.gid = kind, linkname, mode, 4242, 4242
    return info


@pytest.fixture(params=["pep706", "fallback"])
def without_filter(request, monkeypatch):
    if request.param == "fallback":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no PEP 706 filter")
    return request.param


HOSTILE = {
    "absolute": (entry("/tmp/l9-evil"), b"x"),
    "dotdot": (entry("a/../../l9-evil"), b"x"),
    "symlink out": (entry("link", tarfile.SYMTYPE, "/etc"), b""),
    "relative symlink out": (entry("sub/link", tarfile.SYMTYPE, "../../.."), b""),
    "hard link out": (entry("hard", tarfile.LNKTYPE, "/etc/passwd"), b""),
    "device": (entry("dev", tarfile.CHRTYPE), b""),
    "fifo": (entry("fifo", tarfile.FIFOTYPE), b""),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_member_is_refused_and_nothing_escapes(tmp_path, without_filter, case):
    dest = tmp_path / "dest"
    dest.mkdir()
    try:
        extract_data(archive(HOSTILE[case]), dest)
    except (UnsafeArchive, tarfile.TarError):
        pass
    else:  # PEP 706 strips a leading "/" instead of refusing: then it lands inside
        assert case == "absolute" and without_filter == "pep706" and (dest / "tmp" / "l9-evil").is_file()
    assert not (tmp_path / "l9-evil").exists() and not safe_tar.Path("/tmp/l9-evil").exists()


def test_a_plain_archive_unpacks_without_special_bits_or_foreign_owners(tmp_path, without_filter):
    tar = archive((entry("app", tarfile.DIRTYPE, mode=0o777), b""), (entry("app/main.py", mode=0o4777), b"print(1)\n"),
                  (entry("app/alias.py", tarfile.SYMTYPE, "main.py"), b""))
    extract_data(tar, tmp_path)
    main = tmp_path / "app" / "main.py"
    assert main.read_text() == "print(1)\n" and (tmp_path / "app" / "alias.py").read_text() == "print(1)\n"
    mode = stat.S_IMODE(main.stat().st_mode)
    assert not mode & (stat.S_ISUID | stat.S_IWGRP | stat.S_IWOTH)
    assert main.stat().st_uid != 4242


def test_the_fallback_is_used_only_without_the_filter(monkeypatch):
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    with pytest.raises(UnsafeArchive, match="outside"):
        safe_tar._checked(entry("../x"), safe_tar.Path("/tmp/dest"))
