"""No answer of the gateway carries a path of its host: a keyring file, a mount point, a socket, a
state directory tell a tenant how the platform is laid out. Messages are sentences built without
them where the gateway builds them; this is the net under the rest (a library's exception text,
an OSError's filename), applied to every error detail the gateway answers. Pure."""

from __future__ import annotations

import re
from typing import Any, Iterable

# the first directory of a path that can only be the host's (a container's own paths, /app, /data,
# and the API's own URLs are left alone)
HOST_ROOTS = ("tmp", "root", "home", "var", "run", "etc", "opt", "usr", "proc", "sys", "dev", "mnt", "srv", "work",
              "lib", "lib64", "bin", "sbin", "boot", "media", "nix", "private", "Users")
PLACEHOLDER = "[a path on the platform's host]"
_SEGMENT = r"[^\s'\"`,;:()\[\]{}<>]+"


def host_path_pattern(extra_roots: Iterable[str] = ()) -> re.Pattern[str]:
    roots = sorted({*HOST_ROOTS, *(r.strip("/").split("/")[0] for r in extra_roots if r.strip("/"))})
    first = "|".join(re.escape(r) for r in roots)
    # an absolute path (not the tail of a URL or of a relative path) whose first directory is the host's
    return re.compile(rf"(?<![\w/.:~-])/(?:{first})(?:/{_SEGMENT})*/?(?![\w])")


_DEFAULT = host_path_pattern()


def hostless(text: str, pattern: re.Pattern[str] = _DEFAULT) -> str:
    """`text` with every host path replaced by a placeholder."""
    return pattern.sub(PLACEHOLDER, text)


def hostless_detail(detail: Any, pattern: re.Pattern[str] = _DEFAULT) -> Any:
    """An error detail (a sentence, or FastAPI's list of dicts) without host paths."""
    if isinstance(detail, str):
        return hostless(detail, pattern)
    if isinstance(detail, list):
        return [hostless_detail(d, pattern) for d in detail]
    if isinstance(detail, dict):
        return {k: hostless_detail(v, pattern) for k, v in detail.items()}
    return detail
