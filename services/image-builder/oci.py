"""A built image from the registry to a root file system on local disk: `skopeo copy` into an OCI
layout, then its layers applied in order, whiteouts included (what `umoci unpack` does; done here
so the image-builder needs skopeo alone, and so every member is checked before it is written).

The layers come from users' builds, and this runs as root: no member may write outside the root,
through a symlink a lower layer left, or over one (an existing path is removed, never followed).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tarfile
from pathlib import Path

SKOPEO_TIMEOUT_S = 1800.0
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


class PullFailed(Exception):
    """The image could not be copied out of the registry or unpacked; the message says why."""


async def pull(registry: str, reference: str, layout: Path, tag: str = "img") -> None:
    """skopeo copy docker://<registry>/<reference> oci:<layout>:<tag> (plain HTTP: our registry)."""
    cmd = ["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{registry}/{reference}",
           f"oci:{layout}:{tag}"]
    await run(cmd, f"copying {registry}/{reference} out of the registry")


async def delete(registry: str, reference: str) -> None:
    await run(["skopeo", "delete", "--tls-verify=false", f"docker://{registry}/{reference}"],
              f"deleting {registry}/{reference} from the registry")


async def run(cmd: list[str], what: str) -> None:
    try:
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
    except FileNotFoundError:
        raise PullFailed(f"{what} failed: {cmd[0]} is not installed (apt-get install {cmd[0]})") from None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), SKOPEO_TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()
        raise PullFailed(f"{what} took longer than {SKOPEO_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        text = out.decode(errors="replace").strip().splitlines()
        raise PullFailed(f"{what} failed ({cmd[0]} exit {proc.returncode}): {' / '.join(text[-3:])}")


def layers(layout: Path, tag: str = "img") -> list[Path]:
    """The layer blobs of the image tagged `tag` in an OCI layout, base first."""
    index = json.loads((layout / "index.json").read_text())
    manifests = [m for m in index.get("manifests", [])
                 if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
    if not manifests:
        raise PullFailed(f"the OCI layout {layout} has no image tagged {tag!r}")
    manifest = json.loads(_blob(layout, manifests[0]["digest"]).read_text())
    return [_blob(layout, layer["digest"]) for layer in manifest.get("layers", [])]


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def unpack(layout: Path, root: Path, tag: str = "img") -> int:
    """Apply every layer to `root` (created); -> the number of layers."""
    root.mkdir(parents=True, exist_ok=True)
    blobs = layers(layout, tag)
    for blob in blobs:
        apply_layer(blob, root)
    return len(blobs)


def apply_layer(blob: Path, root: Path) -> None:
    """One layer: its whiteouts first (they hide what lower layers made, never what this one
    makes), then its members."""
    with tarfile.open(blob, mode="r:*") as tar:
        members = tar.getmembers()
        for m in members:
            name = _safe_name(m.name)
            base, parent = os.path.basename(name), os.path.dirname(name)
            if base == OPAQUE:
                directory = _inside(root, parent)
                if directory.is_dir() and not directory.is_symlink():
                    for child in directory.iterdir():
                        _remove(child)
            elif base.startswith(WHITEOUT):
                _remove(_inside(root, os.path.join(parent, base[len(WHITEOUT):])))
        for m in members:
            name = _safe_name(m.name)
            if not name or os.path.basename(name).startswith(WHITEOUT):
                continue
            target = _inside(root, name)
            if target.is_symlink() or (target.exists() and not (m.isdir() and target.is_dir())):
                _remove(target)  # replace, never write through what a lower layer left here
            if m.islnk():
                m.linkname = _safe_name(m.linkname)
                source = _inside(root, m.linkname)
                if source.is_symlink():  # os.link follows it: a hard link to whatever it names (a host file)
                    raise PullFailed(f"a layer member {name!r} is a hard link to a symlink ({m.linkname!r})")
            m.name = name
            tar.extract(m, root, set_attrs=True, numeric_owner=True, filter="fully_trusted")


def _safe_name(name: str) -> str:
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PullFailed(f"a layer member {name!r} climbs out of the root")
    return "/".join(parts)


def _inside(root: Path, name: str) -> Path:
    """root/name, refusing a path whose parent resolves (through symlinks) outside the root."""
    path = root / name
    parent = Path(os.path.realpath(path.parent))
    real_root = Path(os.path.realpath(root))
    if parent != real_root and real_root not in parent.parents:
        raise PullFailed(f"a layer member {name!r} would be written outside the root (through a symlink)")
    return path


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def tree_bytes(root: Path) -> int:
    """The bytes of every regular file under root (hard links counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            if (st.st_mode & 0o170000) == 0o100000 and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total
