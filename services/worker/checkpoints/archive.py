"""The checkpoint artifact: one tar holding a CRIU dump of a container and its writable layer.

Layout of the tar (uncompressed; members in this order):
    manifest.json   format version, the dumped container's id and the spec fields a restore needs
                    (env, cpu, memory, command, port), its hostname, the root it ran on (`base`:
                    the image id, or the platform base's identity; `image_id`: "" for the base)
    images/…        CRIU's image directory (runc's descriptors.json included)
    upper/…         the overlay's upper (writable) layer, as it was at the moment of the dump

The sha256 is computed while the tar is written, so nobody reads it twice. Unpacking refuses
anything that would land outside the target (absolute names, `..`, links leaving the tree, writing
through a symlink) and any member type a container's layer cannot hold. Overlay whiteouts (char
devices 0:0) are kept, and so are the `trusted.overlay.*` xattrs of opaque directories (tarfile
does not carry xattrs, so they travel as PAX records `LEVERS9.xattr.<name>` = base64).

Also here: the CRIU configuration texts runc hands to CRIU (dump and restore need different ones),
and the first error of a CRIU log (what a CheckpointError / RestoreError says).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
IMAGES = "images"
UPPER = "upper"
XATTR_PAX = "LEVERS9.xattr."
KEPT_XATTRS = ("trusted.overlay.", "user.", "security.capability")
CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A dump failed; the message is CRIU's (or runc's) own reason."""


class RestoreError(RuntimeError):
    """A restore failed and everything it made was removed; the message says why."""


@dataclass(frozen=True)
class CheckpointArtifact:
    size_bytes: int
    sha256: str
    seconds: float  # the whole checkpoint(): pause, dump, copy of the layer, tar
    dump_seconds: float = 0.0  # runc checkpoint (CRIU) alone
    paused_seconds: float = 0.0  # how long the container was frozen (dump + copy of its layer)
    manifest: dict = field(default_factory=dict)


# ---- CRIU configuration (runc passes the file named by the `org.criu.config` annotation) ----------

# Both: no network lock (CRIU's lock needs iptables-restore or nftables in *its* root and would drop
# SYNs for the whole dump; the container is frozen by its cgroup anyway), established TCP
# connections are neither dumped nor blocked and come back closed (a restored copy has a new
# address: nobody could continue them).
_COMMON = ("tcp-close", "network-lock skip")
# Dump: connections still in a listening socket's accept queue stay with the running container.
DUMP_OPTIONS = (*_COMMON, "skip-in-flight")
# Restore: CRIU 4's mount-v2 fails here ("open_tree /sys"); CRIU refuses this option on a dump.
RESTORE_OPTIONS = (*_COMMON, "mntns-compat-mode")


def dump_config() -> str:
    return "# levers9: CRIU options for dumps of this container\n" + "\n".join(DUMP_OPTIONS) + "\n"


def restore_config() -> str:
    return "# levers9: CRIU options for restoring this container\n" + "\n".join(RESTORE_OPTIONS) + "\n"


def criu_error(log: Path, limit: int = 3) -> str:
    """The error lines of a CRIU log (dump.log / restore.log), the harmless ones left out."""
    try:
        lines = _read_ends(log).splitlines()
    except OSError:
        return f"(no CRIU log at {log})"
    harmless = ("Can't setup RLIMIT_NOFILE", "Can't keep kdat cache")
    errors = [line.split(": ", 1)[-1].strip() if line.startswith("(") else line.strip()
              for line in lines if "Error" in line and not any(h in line for h in harmless)]
    # CRIU logs the cause first and its consequences ("Dumping FAILED.") after
    errors = [e for e in errors if e not in ("Dumping FAILED.", "Restoring FAILED.")]
    if not errors:
        return " | ".join(lines[-3:]) or "(empty CRIU log)"
    return "; ".join(dict.fromkeys(errors[:limit]))


def _read_ends(path: Path, head: int = 1 << 20, tail: int = 4 << 20) -> str:
    """The first and last few MiB of a log (a looping CRIU writes gigabytes)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= head + tail:
            return f.read().decode(errors="replace")
        first = f.read(head)
        f.seek(size - tail)
        return (first + b"\n" + f.read()).decode(errors="replace")


# ---- the manifest (pure) -------------------------------------------------------------------------

def make_manifest(*, container_id: str, hostname: str, ip: str, env: dict[str, str],
                  cpu_millicores: int, memory_mib: int, command: list[str] | tuple[str, ...],
                  port: int, base: str, criu_version: str, created_at: float, image_id: str = "") -> dict:
    """`base`: what the root was (the image id, or the platform base's package-list sha256);
    `image_id`: the image a restore must mount ("" the platform base)."""
    return {"format": FORMAT_VERSION, "container_id": container_id, "hostname": hostname, "ip": ip,
            "env": dict(env), "cpu_millicores": cpu_millicores, "memory_mib": memory_mib,
            "command": list(command), "port": port, "base": base, "image_id": image_id,
            "criu_version": criu_version, "created_at": created_at}


def check_manifest(manifest: object) -> dict:
    """The manifest if it is one this code can restore; RestoreError otherwise."""
    if not isinstance(manifest, dict):
        raise RestoreError("the checkpoint's manifest is not a JSON object")
    if manifest.get("format") != FORMAT_VERSION:
        raise RestoreError(f"checkpoint format {manifest.get('format')!r} is not supported "
                           f"(this worker reads format {FORMAT_VERSION})")
    needed = {"container_id": str, "hostname": str, "env": dict, "cpu_millicores": int,
              "memory_mib": int, "command": list, "port": int, "base": str}
    for key, kind in needed.items():
        if not isinstance(manifest.get(key), kind):
            raise RestoreError(f"the checkpoint's manifest has no valid {key!r}")
    return manifest


# ---- writing -------------------------------------------------------------------------------------

class _HashingWriter(io.RawIOBase):
    def __init__(self, raw):
        self.raw = raw
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data)
        self.raw.write(view)
        self.sha.update(view)
        self.size += len(view)
        return len(view)


def write_tar(out: Path, manifest: dict, images: Path, upper: Path) -> tuple[int, str]:
    """Write the checkpoint tar to `out` atomically (a temp file renamed); (size, sha256 hex)."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as raw:
            writer = _HashingWriter(raw)
            with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT,
                              bufsize=CHUNK) as tar:
                body = json.dumps(manifest, indent=1, sort_keys=True).encode()
                info = tarfile.TarInfo(MANIFEST)
                info.size, info.mode, info.mtime = len(body), 0o644, int(manifest.get("created_at", 0))
                tar.addfile(info, io.BytesIO(body))
                _add_tree(tar, images, IMAGES)
                _add_tree(tar, upper, UPPER)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return writer.size, writer.sha.hexdigest()


def _add_tree(tar: tarfile.TarFile, root: Path, arcroot: str) -> None:
    """`root` and everything under it, directories before their contents, sorted (reproducible)."""
    _add(tar, root, arcroot)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        for name in sorted(dirnames) + sorted(filenames):
            path = os.path.join(dirpath, name)
            arcname = f"{arcroot}/{name}" if rel == "." else f"{arcroot}/{rel}/{name}"
            _add(tar, Path(path), arcname)
        # os.walk does not descend into symlinked dirs (followlinks=False): they are added as links


def _add(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    info = tar.gettarinfo(str(path), arcname)
    if info is None:  # a socket: nothing a restore could use
        return
    xattrs = _xattrs(path)
    if xattrs:
        info.pax_headers = {f"{XATTR_PAX}{k}": base64.b64encode(v).decode() for k, v in xattrs.items()}
    if info.isreg():
        with open(path, "rb") as f:
            tar.addfile(info, f)
    else:
        tar.addfile(info)


def _xattrs(path: Path) -> dict[str, bytes]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.startswith(KEPT_XATTRS):
            try:
                found[name] = os.getxattr(path, name, follow_symlinks=False)
            except OSError:
                pass
    return found


# ---- checking and reading ------------------------------------------------------------------------

def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def tar_is_valid(tar: Path, sha256: str) -> bool:
    """True when `tar` hashes to `sha256` and starts with a manifest of a format we read."""
    try:
        if file_sha256(Path(tar)) != sha256.lower():
            return False
        read_manifest(Path(tar))
    except (OSError, RestoreError, tarfile.TarError, ValueError):
        return False
    return True


def read_manifest(tar: Path) -> dict:
    """The manifest, the tar's first member (cheap: nothing else is read)."""
    with tarfile.open(tar, mode="r|") as archive:
        first = archive.next()
        if first is None or first.name != MANIFEST or not first.isreg() or first.size > 1 << 20:
            raise RestoreError(f"{tar} is not a levers9 checkpoint (no {MANIFEST} first)")
        data = archive.extractfile(first)
        assert data is not None
        try:
            return check_manifest(json.loads(data.read()))
        except ValueError as exc:
            raise RestoreError(f"the checkpoint's manifest is not valid JSON: {exc}") from exc


class UnsafeMember(RestoreError):
    pass


def safe_name(name: str) -> PurePosixPath:
    """The member name as a relative path, refusing absolute names, `..` and empty ones."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or "\0" in name:
        raise UnsafeMember(f"unsafe name in the checkpoint tar: {name!r}")
    parts = [p for p in path.parts if p != "."]
    if not parts:
        raise UnsafeMember(f"unsafe name in the checkpoint tar: {name!r}")
    return PurePosixPath(*parts)


def unpack(tar: Path, dest: Path) -> dict:
    """Unpack the checkpoint into `dest` (made; must not exist): dest/images, dest/upper; the manifest.

    Refuses (UnsafeMember, a RestoreError) anything outside `dest`; ownership, modes, times,
    whiteouts and overlay xattrs are kept (we run as root)."""
    dest = Path(dest)
    dest.mkdir(parents=True)
    real_dest = os.path.realpath(dest)
    manifest: dict | None = None
    with tarfile.open(tar, mode="r|", bufsize=CHUNK) as archive:
        for member in archive:
            name = safe_name(member.name)
            if manifest is None:
                if str(name) != MANIFEST or not member.isreg() or member.size > 1 << 20:
                    raise RestoreError(f"{tar} is not a levers9 checkpoint (no {MANIFEST} first)")
                data = archive.extractfile(member)
                assert data is not None
                try:
                    manifest = check_manifest(json.loads(data.read()))
                except ValueError as exc:
                    raise RestoreError(f"the checkpoint's manifest is not valid JSON: {exc}") from exc
                continue
            if name.parts[0] not in (IMAGES, UPPER):
                raise UnsafeMember(f"unexpected member in the checkpoint tar: {member.name!r}")
            _check_type(member)
            target = os.path.join(real_dest, *name.parts)
            parent = os.path.realpath(os.path.dirname(target))
            if parent != real_dest and not parent.startswith(real_dest + os.sep):
                raise UnsafeMember(f"{member.name!r} would be written outside the checkpoint dir "
                                   f"(through a symlink)")
            if os.path.lexists(target) and not os.path.isdir(target):
                raise UnsafeMember(f"{member.name!r} appears twice in the checkpoint tar")
            if member.islnk():
                link = safe_name(member.linkname)
                if link.parts[0] != name.parts[0]:
                    raise UnsafeMember(f"hard link {member.name!r} -> {member.linkname!r} leaves its tree")
                member.linkname = str(link)
            member.name = str(name)
            archive.extract(member, real_dest, set_attrs=True, numeric_owner=True,
                            **_no_filter())
            _set_xattrs(target, member.pax_headers)
    if manifest is None:
        raise RestoreError(f"{tar} is empty")
    for part in (IMAGES, UPPER):
        if not (dest / part).is_dir():
            raise RestoreError(f"the checkpoint tar has no {part}/")
    return manifest


def _check_type(member: tarfile.TarInfo) -> None:
    if member.isreg() or member.isdir() or member.issym() or member.islnk() or member.isfifo():
        return
    if member.ischr() and member.devmajor == 0 and member.devminor == 0:
        return  # an overlay whiteout
    raise UnsafeMember(f"{member.name!r} is a device or special file; a checkpoint holds none")


def _no_filter() -> dict:
    # our own checks above replace tarfile's extraction filters (3.12+ / 3.11.4+), which would
    # strip the whiteouts and absolute symlinks a container's layer legitimately has
    return {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}


def _set_xattrs(target: str, pax: Mapping[str, str]) -> None:
    for key, value in pax.items():
        if key.startswith(XATTR_PAX):
            name = key[len(XATTR_PAX):]
            if not name.startswith(KEPT_XATTRS):
                continue
            try:
                os.setxattr(target, name, base64.b64decode(value), follow_symlinks=False)
            except OSError as exc:
                raise RestoreError(f"cannot set {name} on {target}: {exc}") from exc


def make_traversable(images: Path) -> None:
    """CRIU opens the images after it entered the restored tasks' context: the directory must be
    searchable and its files readable beyond root's own DAC override (runc made them 0700/0600)."""
    os.chmod(images, 0o755)
    for entry in os.scandir(images):
        if entry.is_file(follow_symlinks=False):
            mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)
            os.chmod(entry.path, mode | 0o444)
