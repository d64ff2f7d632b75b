"""Applying a user's image layer (levers9.image_builder.oci.apply_layer) never writes or links
anything outside the root: the layers come from tenants' build steps and this runs as root."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from levers9.image_builder.oci import PullFailed, apply_layer


def _layer(path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> Path:
    with tarfile.open(path, "w") as tar:
        for m in members:
            body = (data or {}).get(m.name)
            if body is not None:
                m.size = len(body)
            tar.addfile(m, io.BytesIO(body) if body is not None else None)
    return path


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.linkname = kind, target
    return m


def test_a_hard_link_through_a_symlink_to_a_host_file_is_refused(tmp_path):
    secret = tmp_path / "host-secret"
    secret.write_text("the host's secret")
    root = tmp_path / "root"
    root.mkdir()
    layer = _layer(tmp_path / "l.tar", [_link("a", str(secret), tarfile.SYMTYPE), _link("b", "a", tarfile.LNKTYPE)])
    with pytest.raises(PullFailed):
        apply_layer(layer, root)
    assert not (root / "b").exists() and os.stat(secret).st_nlink == 1


def test_members_climbing_out_or_through_a_symlinked_dir_are_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    for members in ([tarfile.TarInfo("../x")],
                    [_link("d", str(outside), tarfile.SYMTYPE), tarfile.TarInfo("d/x")]):
        with pytest.raises(PullFailed):
            apply_layer(_layer(tmp_path / "l.tar", members, {"../x": b"x", "d/x": b"x"}), root)
    assert list(outside.iterdir()) == []


def test_an_ordinary_layer_with_links_inside_applies(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    f = tarfile.TarInfo("etc/motd")
    d = tarfile.TarInfo("etc")
    d.type = tarfile.DIRTYPE
    apply_layer(_layer(tmp_path / "l.tar", [d, f, _link("etc/motd2", "etc/motd", tarfile.LNKTYPE),
                                            _link("etc/motd3", "motd", tarfile.SYMTYPE)], {"etc/motd": b"hi"}), root)
    assert (root / "etc/motd2").read_text() == "hi" and os.readlink(root / "etc/motd3") == "motd"
