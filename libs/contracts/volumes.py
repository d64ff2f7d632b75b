"""Volumes and cloud buckets (pure): what a deployment mounts, and the checks that keep every path
inside the workspace's own directory.

A volume is a directory of the platform's JuiceFS file system, `<data>/<workspace>/<volume>`; each
worker (and the gateway, for `levers9 volumes put/get/ls/rm`) mounts that file system at its own
data directory, so what one container writes the next reads, on any worker. A cloud bucket is an S3
bucket mounted per container by s3fs with the credentials of a workspace secret.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Annotated

import msgspec
from msgspec import Meta

VolumeName = Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]  # a subject token, a directory name
BucketName = Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")]  # S3's rules
SecretName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
MountPath = Annotated[str, Meta(pattern=r"^/[^\x00,:\\]*$", max_length=256)]
EndpointUrl = Annotated[str, Meta(pattern=r"^(https?://[A-Za-z0-9.:\[\]-]+)?$", max_length=256)]

# where a volume may not go: over a system directory, or at or under the platform's own mounts
RESERVED = ("/", "/bin", "/etc", "/lib", "/lib64", "/root", "/sbin", "/usr", "/var", "/tmp", "/run", "/opt")
RESERVED_TREES = ("/proc", "/dev", "/sys", "/app", "/opt/levers9", "/opt/levers9-vendor", "/run/levers9",
                  "/var/log/levers9", "/var/lib/levers9")
MAX_MOUNTS = 16


class InvalidPath(ValueError):
    """A path that would leave its volume, or name nothing; the message says which part is wrong."""


class VolumeMount(msgspec.Struct, frozen=True, kw_only=True):
    """`Volume(name, mount_path)`: the workspace's volume `name` at `mount_path` in the container."""
    name: VolumeName
    mount_path: MountPath

    def __post_init__(self) -> None:
        check_mount_path(self.mount_path)


class BucketMount(msgspec.Struct, frozen=True, kw_only=True):
    """`CloudBucket(bucket, mount_path, secret)`: an S3 bucket at `mount_path`, mounted by s3fs with
    the workspace secret `secret` ("ACCESS_KEY:SECRET_KEY"); `endpoint_url` "" is the platform's S3."""
    bucket: BucketName
    mount_path: MountPath
    secret: SecretName
    read_only: bool = False
    endpoint_url: EndpointUrl = ""

    def __post_init__(self) -> None:
        check_mount_path(self.mount_path)


def check_mount_path(path: str) -> None:
    """A container path a mount may take: absolute, normal (no `.`, `..`, `//`, trailing `/`), not a
    system directory nor inside the platform's own."""
    if not path.startswith("/") or posixpath.normpath(path) != path or "//" in path:
        raise ValueError(f"mount path {path!r} must be an absolute, normalised path such as /cache")
    if path in RESERVED or any(path == t or path.startswith(t + "/") for t in RESERVED_TREES):
        raise ValueError(f"mount path {path!r} is reserved by the container or the platform; "
                         f"use a directory of its own such as /data or /cache")


def check_mounts(volumes: list[VolumeMount], buckets: list[BucketMount]) -> None:
    """Mount paths of one deployment: at most MAX_MOUNTS, each used once, none inside another."""
    paths = [v.mount_path for v in volumes] + [b.mount_path for b in buckets]
    if len(paths) > MAX_MOUNTS:
        raise ValueError(f"a deployment mounts at most {MAX_MOUNTS} volumes and buckets, not {len(paths)}")
    for i, a in enumerate(paths):
        for b in paths[i + 1:]:
            if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                raise ValueError(f"mount paths {a!r} and {b!r} overlap: give each volume its own directory")


def relative_path(path: str) -> str:
    """A path inside a volume as the CLI gives it ("a/b.txt", "/a/b.txt", "" for the top), made
    relative and normal; `..` anywhere, NUL or a backslash is refused (never resolved away)."""
    if "\x00" in path or "\\" in path:
        raise InvalidPath(f"path {path!r} has a NUL or a backslash")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidPath(f"path {path!r} leaves the volume ('..' is not allowed)")
    if any(len(p.encode()) > 255 for p in parts) or len(path) > 4096:
        raise InvalidPath(f"path {path[:80]!r}... is too long")
    return "/".join(parts)


def volume_dir(data_dir: str, workspace: str, name: str) -> str:
    """Where a workspace's volume lives under a data directory (a JuiceFS mount)."""
    msgspec.convert(name, VolumeName)  # a name decoded elsewhere is checked again: never `..` or `/`
    msgspec.convert(workspace, VolumeName)
    return posixpath.join(data_dir, workspace, name)


def inside(root: str, resolved: str) -> bool:
    """Whether `resolved` (a realpath) is `root` or below it: a symlink never leads out."""
    return resolved == root or resolved.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class Bind:
    source: str  # on the host
    destination: str  # in the container
    read_only: bool = False


def volume_binds(data_dir: str, workspace: str, volumes: list[VolumeMount]) -> list[Bind]:
    """The bind mounts of a container's volumes: the workspace's own directories and nothing else."""
    return [Bind(volume_dir(data_dir, workspace, v.name), v.mount_path) for v in volumes]


def bucket_dir(state_dir: str, container_id: str, index: int) -> str:
    """Where the worker mounts a container's `index`th bucket on the host."""
    return posixpath.join(state_dir, "buckets", container_id, str(index))


def bucket_binds(state_dir: str, container_id: str, buckets: list[BucketMount]) -> list[Bind]:
    return [Bind(bucket_dir(state_dir, container_id, i), b.mount_path, b.read_only) for i, b in enumerate(buckets)]


def s3fs_args(bucket: BucketMount, target: str, passwd_file: str, endpoint_url: str) -> list[str]:
    """s3fs-fuse's command line for one bucket (path-style requests: SeaweedFS and MinIO need them)."""
    options = [f"passwd_file={passwd_file}", f"url={bucket.endpoint_url or endpoint_url}", "use_path_request_style",
               "allow_other", "ro" if bucket.read_only else ""]
    return ["s3fs", bucket.bucket, target, "-o", ",".join(o for o in options if o)]


def passwd_line(secret_value: str) -> str:
    """s3fs's passwd file from a secret "ACCESS_KEY:SECRET_KEY"."""
    access, sep, secret = secret_value.strip().partition(":")
    if not sep or not access or not secret:
        raise ValueError("a cloud bucket's secret must hold ACCESS_KEY:SECRET_KEY")
    return f"{access}:{secret}\n"
