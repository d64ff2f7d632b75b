"""The credentials of one stack: generated on first use, kept 0600 under home/credentials/ (0700).

    credentials/stack.json     every password and key of this stack (Postgres roles, S3 identities,
                               registry users); missing ones are generated on each `up` (an old home
                               gains them: the servers are then told, see postgres.after_ready)
    credentials/registry-*.json  a containers auth file per registry user (buildah/skopeo read it
                               through REGISTRY_AUTH_FILE)
    credentials/worker*.json   the environment of a worker's credentials, for the pool controller to
                               start workers with (it never holds them in its own environment)

Who gets what is decided here, by `role_env` (pure): each service only the credentials its role uses,
and nothing of the caller's own (`STRIPPED`). The servers are configured from the same file: Postgres
roles (postgres.py), S3 identities (s3.py), the registry's htpasswd (registry.py).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from pathlib import Path
from typing import Mapping, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from levers9.runtime.config import SERVICES
from levers9.runtime.credentials import BUILD_POOL
from levers9.runtime.projection import schema_for

ADMIN = "admin"
# the Postgres role of each service: `levers9_<its schema>`; the admin is the superuser `postgres`
PG_ADMIN_ROLE = "postgres"
PG_ROLE_PREFIX = "levers9_"
VOLUMES_SCHEMA = "juicefs"  # JuiceFS's metadata (libs/runtime/juicefs.py): the gateway's and workers'
VOLUMES_ROLE = "levers9_volumes"  # owns it (no login); the gateway and workers are its members
VOLUMES_MEMBERS = ("gateway", "worker")
# registry users: the build pool's workers push and pull layers; the image-builder copies images out
# and deletes them. Plain htpasswd cannot tell a push from a pull, so nobody else gets a password.
REGISTRY_USERS = ("build", "image-builder")

# what each role uses: "s3" its own S3 key; "keyring" the secrets keyring (sealed secrets and
# checkpoints); "registry" a registry password; "worker_token" its gateway token; "workers" the
# credentials of the workers it starts (a file it reads, never its own environment)
NEEDS: dict[str, frozenset[str]] = {
    "gateway": frozenset({"s3", "keyring"}),
    "scheduler": frozenset({"s3"}),
    "pool-controller": frozenset({"workers"}),
    "checkpoint-store": frozenset({"s3", "keyring"}),
    "image-builder": frozenset({"s3", "registry"}),
    "worker": frozenset({"s3", "keyring", "worker_token"}),
}

# SeaweedFS identities (-s3.config): actions per bucket prefix. Workspace buckets are levers9-<ws>,
# created on first use (CreateBucket is SeaweedFS's "Admin" action, limited here to that prefix).
ALL_LEVERS9 = ("Read:levers9-*", "Write:levers9-*", "List:levers9-*", "Tagging:levers9-*", "Admin:levers9-*")


def s3_actions(role: str, volumes_bucket: str) -> list[str]:
    """The S3 actions of `role`: what it reads and writes, nothing more."""
    volumes = [f"{a}:{volumes_bucket}" for a in ("Read", "Write", "List", "Admin")]
    return {
        ADMIN: ["Admin", "Read", "Write", "List", "Tagging"],
        "gateway": [*ALL_LEVERS9, *volumes],  # code archives, function blobs (presigned), catalogues
        "checkpoint-store": list(ALL_LEVERS9),  # checkpoints in workspace buckets
        "image-builder": list(ALL_LEVERS9),  # image archives and indexes in workspace buckets
        "worker": ["Read:levers9-*", "List:levers9-*", *volumes],  # its node cache reads; volumes
        "scheduler": ["Read:levers9-platform", "List:levers9-platform"],  # the catalogues
    }[role]


def s3_roles() -> tuple[str, ...]:
    return (ADMIN, *(r for r in SERVICES if "s3" in NEEDS[r]))


def pg_role(service: str) -> str:
    return PG_ROLE_PREFIX + schema_for(service)


def _password() -> str:
    return secrets.token_urlsafe(24)  # URL-safe: it goes into DSNs and SQL literals unquoted


def complete(creds: Mapping) -> dict:
    """`creds` with every missing password and key generated (existing ones are kept)."""
    out = {"postgres": dict(creds.get("postgres", {})), "s3": dict(creds.get("s3", {})),
           "registry": dict(creds.get("registry", {}))}
    for role in (ADMIN, *SERVICES):
        out["postgres"].setdefault(role, _password())
    for role in s3_roles():
        out["s3"].setdefault(role, {"access_key": "L9" + secrets.token_hex(9).upper(), "secret_key": _password()})
    for user in (ADMIN, *REGISTRY_USERS):
        out["registry"].setdefault(user, _password())
    return out


def credentials_dir(home: Path) -> Path:
    return Path(home) / "credentials"


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by its owner only, from the first byte (never a wider mode)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def ensure(home: Path) -> dict:
    """This stack's credentials, generating (and saving) what is missing."""
    path = credentials_dir(home) / "stack.json"
    try:
        current = json.loads(path.read_text())
    except (OSError, ValueError):
        current = {}
    creds = complete(current)
    if creds != current:
        write_private(path, json.dumps(creds, indent=2, sort_keys=True) + "\n")
    os.chmod(credentials_dir(home), 0o700)
    return creds


# ---- what each role is given ----------------------------------------------------------------------


def role_dsn(admin_url: str, role: str, password: str) -> str:
    """The admin's DSN with another user and password (same host, port, database, options)."""
    parts = urlsplit(admin_url)
    host = parts.hostname or ""
    netloc = f"{role}:{password}@{f'[{host}]' if ':' in host else host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def with_password(url: str, user: str, password: str) -> str:
    return role_dsn(url, user, password)


def registry_auth(registry_hosts: list[str], user: str, password: str) -> str:
    """A containers auth file (REGISTRY_AUTH_FILE) with `user`'s password for each registry address."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return json.dumps({"auths": {host: {"auth": token} for host in registry_hosts}}, indent=2) + "\n"


class Given(NamedTuple):
    """What this stack has to give: its servers' admin DSN, which servers are its own (with roles),
    the registry auth files per user, the keyring settings, the credentials of external servers, the
    workers' credentials directory and the static worker's token."""
    admin_dsn: str = ""
    own_postgres: bool = False
    own_s3: bool = False
    registry_auth_files: Mapping[str, str] = {}
    keyring: Mapping[str, str] = {}
    external: Mapping[str, str] = {}
    worker_credentials: str = ""
    worker_token: str = ""


def role_env(role: str, creds: Mapping, given: Given, pool: str = "") -> dict[str, str]:
    """The credentials `role` is given, as environment variables (pure).

    `given.external`: the credentials the settings name for external servers (their DSN, S3 keys):
    every role gets those, as with a single role there is nothing to tell apart. `pool`: a worker's
    pool (the build pool's workers also get the registry)."""
    needs = NEEDS[role]
    env: dict[str, str] = {}
    external = given.external
    if given.own_postgres:
        env["LEVERS9_DATABASE_URL"] = role_dsn(given.admin_dsn, pg_role(role), creds["postgres"][role])
    elif external.get("LEVERS9_DATABASE_URL"):
        env["LEVERS9_DATABASE_URL"] = external["LEVERS9_DATABASE_URL"]
    if "s3" in needs:
        if given.own_s3:
            key = creds["s3"][role]
            env.update(LEVERS9_S3_ACCESS_KEY=key["access_key"], LEVERS9_S3_SECRET_KEY=key["secret_key"])
        else:
            env.update({k: v for k, v in external.items() if k.startswith("LEVERS9_S3_") and v})
    user = "image-builder" if role == "image-builder" else ("build" if role == "worker" and pool == BUILD_POOL else "")
    if user and given.registry_auth_files.get(user):
        env["REGISTRY_AUTH_FILE"] = given.registry_auth_files[user]
    if "keyring" in needs:
        env.update({k: v for k, v in given.keyring.items() if v})
    if "worker_token" in needs and given.worker_token:
        env["LEVERS9_WORKER_TOKEN"] = given.worker_token
    if "workers" in needs and given.worker_credentials:
        env["LEVERS9_WORKER_CREDENTIALS"] = given.worker_credentials
    return env

