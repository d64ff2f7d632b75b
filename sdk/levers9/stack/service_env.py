"""What a service process started by `levers9 up` is given: the settings, the servers' addresses, and
only the credentials of its role (levers9.stack.credentials decides which).

Nothing of the caller's own credentials passes (its environment and profile hold the admin's); the
pool controller gets the directory of its workers' credentials, never them in its environment. The
admin's own S3 keys go into the profile (0600), for the CLI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from levers9.runtime.config import Settings, write_profile
from levers9.runtime.credentials import without_credentials, worker_file

from . import credentials, nats_server, postgres, registry, s3
from .home import Home, Server

LAUNCHERS: dict[str, Server] = {s.name: s for s in (postgres.SERVER, s3.SERVER, registry.SERVER)}


def service_env(files: Home, settings: Settings, name: str, port: int, urls: dict[str, str],
                extra_env: dict[str, str] | None) -> dict[str, str]:
    """The environment of service `name`: the settings and server addresses, and only the
    credentials of its role (the caller's own, and every other role's, are left out)."""
    env = {**without_credentials({**os.environ, **settings.as_env()}),
           **{f"LEVERS9_{key.upper()}": url for key, url in urls.items() if key != "database_url"},
           "LEVERS9_SERVICE": name, "LEVERS9_HTTP_PORT": str(port), "LEVERS9_HOME": str(files.path)}
    if name == "worker":
        env["LEVERS9_WORKER_ID"] = settings.worker.id or "local-1"
    if name in credentials.NEEDS:
        env.update(role_env(files, settings, name, urls, settings.worker.pool))
    env.update(extra_env or {})
    env.update(nats_server.service_env(files.path, files.read_state()["components"].get("nats"), name,
                                       env.get("LEVERS9_WORKER_ID", "")))
    return env


def role_env(files: Home, settings: Settings, role: str, urls: dict[str, str], pool: str = "") -> dict[str, str]:
    """The credentials of `role` (credentials.role_env) for this stack's servers. For the pool
    controller, its workers' are written to files in the credentials directory first."""
    components = files.read_state()["components"]

    def own(name: str) -> bool:
        entry = components.get(name, {})
        return bool(entry) and not entry.get("external") and LAUNCHERS[name].current(entry)

    s = settings
    home = files.path
    creds = credentials.ensure(home)
    external = {"LEVERS9_DATABASE_URL": urls.get("database_url", ""),
                "LEVERS9_S3_ACCESS_KEY": s.storage.s3_access_key, "LEVERS9_S3_SECRET_KEY": s.storage.s3_secret_key}
    auth_files = ({user: str(registry.auth_file(home, user)) for user in credentials.REGISTRY_USERS}
                  if own("registry") else {})
    directory = credentials.credentials_dir(home)
    given = credentials.Given(
        admin_dsn=urls.get("database_url", ""), own_postgres=own("postgres"), own_s3=own("s3"),
        registry_auth_files=auth_files, external=external, worker_credentials=str(directory),
        keyring={"LEVERS9_SECRET_KEY": s.secrets.key, "LEVERS9_SECRET_KEY_FILE": s.secrets.key_file},
        worker_token=s.worker.token)
    if role == "pool-controller":  # its workers' are written to files; its worker_token is not theirs
        for worker_pool in ("", credentials.BUILD_POOL):
            worker = credentials.role_env("worker", creds, given._replace(worker_token=""), worker_pool)
            credentials.write_private(worker_file(directory, worker_pool), json.dumps(worker, indent=2) + "\n")
    return credentials.role_env(role, creds, given, pool)


def write_admin_profile(files: Home, settings: Settings, state: dict) -> None:
    """The admin's S3 keys in the profile (0600), for the CLI and whoever uses this home as its
    admin; services never read credentials from the profile (Settings.load)."""
    entry = state["components"].get("s3", {})
    if entry.get("external") or not entry.get("roles"):
        return
    key = credentials.ensure(files.path)["s3"][credentials.ADMIN]
    values = {"s3_access_key": key["access_key"], "s3_secret_key": key["secret_key"]}
    if {k: settings.get(k) for k in values} != values:
        write_profile(files.path / "config.toml", values)


def admin_credentials(home: Path) -> dict[str, str]:
    """What the admin of this home uses: S3 keys and a registry auth file (for tests and tools)."""
    creds = credentials.ensure(home)
    key = creds["s3"][credentials.ADMIN]
    return {"s3_access_key": key["access_key"], "s3_secret_key": key["secret_key"],
            "registry_auth_file": str(registry.auth_file(home, credentials.ADMIN))}
