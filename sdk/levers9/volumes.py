"""Volumes and cloud buckets in an app (standard library only: it runs inside containers too).

    cache = Volume("cache", "/cache")                     # `levers9 volumes create cache` first
    raw = CloudBucket("my-bucket", "/raw", secret="S3_CREDS", read_only=True)

    @app.endpoint(volumes=[cache, raw])
    def handler(...): ...

A Volume is the workspace's directory on the platform's JuiceFS (kept across containers and workers);
a CloudBucket is an S3 bucket mounted per container with s3fs, using a secret that holds
"ACCESS_KEY:SECRET_KEY" (`levers9 secret create S3_CREDS AKIA...:...`). The platform checks the same
rules again (levers9.contracts.volumes); these checks say what is wrong before anything is deployed.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from levers9.options import ConfigError

VOLUME_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
SECRET_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def _mount_path(path: Any) -> str:
    if not isinstance(path, str) or not path.startswith("/") or posixpath.normpath(path) != path or path == "/" \
            or "//" in path:
        raise ConfigError(f"mount path {path!r} is not valid: use an absolute path of its own, e.g. '/cache'")
    return path


@dataclass(frozen=True)
class Volume:
    """The workspace's volume `name` (created with `levers9 volumes create NAME`) at `mount_path`."""
    name: str
    mount_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not VOLUME_NAME_RE.match(self.name):
            raise ConfigError(f"volume name {self.name!r} is not valid: use a-z, 0-9 and '-', e.g. 'model-cache'")
        _mount_path(self.mount_path)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mount_path": self.mount_path}


@dataclass(frozen=True)
class CloudBucket:
    """An S3 bucket at `mount_path`, with the credentials in workspace secret `secret`
    ("ACCESS_KEY:SECRET_KEY"); `endpoint_url` "" means the platform's own S3."""
    bucket: str
    mount_path: str
    secret: str
    read_only: bool = False
    endpoint_url: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.bucket, str) or not BUCKET_RE.match(self.bucket):
            raise ConfigError(f"bucket {self.bucket!r} is not a valid S3 bucket name (3-63 of a-z, 0-9, '.', '-')")
        _mount_path(self.mount_path)
        if not isinstance(self.secret, str) or not SECRET_RE.match(self.secret):
            raise ConfigError(f"secret {self.secret!r} is not valid: name a secret that holds ACCESS_KEY:SECRET_KEY")
        if not isinstance(self.read_only, bool):
            raise ConfigError(f"read_only {self.read_only!r} is not valid: use True or False")

    def to_dict(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "mount_path": self.mount_path, "secret": self.secret,
                "read_only": self.read_only, "endpoint_url": self.endpoint_url}


def split_mounts(volumes: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`volumes=[...]` of a decorator as the spec's `volumes` and `buckets`."""
    if not isinstance(volumes, (list, tuple)):
        raise ConfigError(f"volumes {volumes!r} is not valid: use a list, e.g. volumes=[Volume('cache', '/cache')]")
    out: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
    for v in volumes:
        if not isinstance(v, (Volume, CloudBucket)):
            raise ConfigError(f"volumes takes Volume(...) and CloudBucket(...) objects, not {v!r}")
        out[isinstance(v, CloudBucket)].append(v.to_dict())
    paths = [m["mount_path"] for m in out[0] + out[1]]
    if len(set(paths)) != len(paths):
        raise ConfigError(f"two volumes share a mount path in {paths}: give each its own")
    return out
