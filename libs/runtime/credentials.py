"""Credentials in a process's environment: which variables carry one, and a worker's own set.

`levers9 up` gives each service only the credentials of its role (levers9.stack.credentials). The
pool controller starts workers: it never holds their credentials in its environment, only the
directory (`worker_credentials`) where `up` wrote them (0600), read when a worker starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

BUILD_POOL = "build"

# every variable that carries a credential, or names a file holding one: a child process is given
# none of its parent's, only those of its own role
STRIPPED = ("LEVERS9_DATABASE_URL", "LEVERS9_S3_ACCESS_KEY", "LEVERS9_S3_SECRET_KEY", "LEVERS9_TOKEN",
            "LEVERS9_WORKER_TOKEN", "LEVERS9_SECRET_KEY", "LEVERS9_SECRET_KEY_FILE", "LEVERS9_NATS_CREDS",
            "LEVERS9_NATS_ISSUER", "LEVERS9_BUS_SIGNING_KEY", "LEVERS9_WORKER_CREDENTIALS", "REGISTRY_AUTH_FILE",
            "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "PGPASSWORD", "PGPASSFILE", "PGUSER")


def without_credentials(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in STRIPPED}


def worker_file(directory: Path, pool: str) -> Path:
    """Where `up` writes the environment of a worker of `pool` (the build pool's also has the registry)."""
    return Path(directory) / ("worker-build.json" if pool == BUILD_POOL else "worker.json")


def worker_env(directory: str, pool: str) -> dict[str, str]:
    """The credentials of a worker of `pool`, as environment variables; {} without a directory (the
    controller then passes on none of its own: a worker started so has only what its settings say)."""
    if not directory:
        return {}
    try:
        return dict(json.loads(worker_file(Path(directory), pool).read_text()))
    except (OSError, ValueError):
        return {}
