"""Postgres roles of one stack: one login role per service, owning its own schema and nothing else.

`configure` runs as the superuser at every start (idempotent): it sets every password (so an old home
and a changed credentials file both converge), gives each service schema to its role (an old home's
schemas, and their tables, were the superuser's), and takes away what PUBLIC had: connecting to the
databases and using schema public. A service role has no CREATE on the database, so it cannot make
itself another schema either; the projection store creates a schema only when it is missing.

JuiceFS's schema (volumes) is shared by the gateway and the workers: it belongs to a role without
login, `levers9_volumes`, whose members they are; what either creates there is granted to the other.

`statements` is the pure part (what to run), tested without a server.
"""

from __future__ import annotations

from typing import Mapping

import asyncpg

from levers9.runtime.config import SERVICES
from levers9.runtime.projection import ident, schema_for
from levers9.runtime.rebuild import give_schema

from .credentials import ADMIN, PG_ADMIN_ROLE, VOLUMES_MEMBERS, VOLUMES_ROLE, VOLUMES_SCHEMA, pg_role

ROLE_OPTIONS = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT"


def literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def role_statements(passwords: Mapping[str, str], existing: set[str]) -> list[str]:
    """CREATE/ALTER ROLE for the superuser, every service and the volumes group (pure)."""
    out = [f"ALTER ROLE {PG_ADMIN_ROLE} PASSWORD {literal(passwords[ADMIN])}"]
    for service in SERVICES:
        role = pg_role(service)
        verb = "ALTER" if role in existing else "CREATE"
        out.append(f"{verb} ROLE {role} {ROLE_OPTIONS} PASSWORD {literal(passwords[service])}")
    if VOLUMES_ROLE not in existing:
        out.append(f"CREATE ROLE {VOLUMES_ROLE} NOLOGIN")
    out += [f"GRANT {VOLUMES_ROLE} TO {pg_role(s)}" for s in VOLUMES_MEMBERS]
    return out


def database_statements(database: str) -> list[str]:
    """Who may connect, and schema public closed (pure)."""
    db = ident(database)
    roles = ", ".join(pg_role(s) for s in SERVICES)
    return [f"REVOKE ALL ON DATABASE {db} FROM PUBLIC", "REVOKE ALL ON DATABASE postgres FROM PUBLIC",
            f"GRANT CONNECT ON DATABASE {db} TO {roles}",
            "REVOKE ALL ON SCHEMA public FROM PUBLIC"]


def schema_statements(existing_schemas: set[str]) -> list[str]:
    """Each service's schema created for (or given to) its role; the volumes schema to its group (pure)."""
    out = []
    for service in SERVICES:
        schema, role = schema_for(service), pg_role(service)
        if schema not in existing_schemas:  # an existing one is given to its role in configure()
            out.append(f"CREATE SCHEMA {schema} AUTHORIZATION {role}")
        out.append(f"REVOKE ALL ON SCHEMA {schema} FROM PUBLIC")
    if VOLUMES_SCHEMA not in existing_schemas:
        out.append(f"CREATE SCHEMA {VOLUMES_SCHEMA} AUTHORIZATION {VOLUMES_ROLE}")
    members = [pg_role(s) for s in VOLUMES_MEMBERS]
    for member in members:
        for kind in ("TABLES", "SEQUENCES"):
            out.append(f"ALTER DEFAULT PRIVILEGES FOR ROLE {member} IN SCHEMA {VOLUMES_SCHEMA} "
                       f"GRANT ALL ON {kind} TO {VOLUMES_ROLE}")
    return out


async def configure(dsn: str, passwords: Mapping[str, str], database: str = "levers9") -> list[str]:
    """Roles, passwords, schemas and grants, as the superuser over `dsn` (a connection to `database`);
    what changed beyond the passwords, in words."""
    conn = await asyncpg.connect(dsn, timeout=10)
    changed: list[str] = []
    try:
        async with conn.transaction():
            roles = {r["rolname"] for r in await conn.fetch("SELECT rolname FROM pg_roles")}
            schemas = {r["nspname"] for r in await conn.fetch("SELECT nspname FROM pg_namespace")}
            new_roles = [pg_role(s) for s in SERVICES if pg_role(s) not in roles]
            if new_roles:
                changed.append(f"created roles {', '.join(new_roles)}")
            for stmt in (*role_statements(passwords, roles), *database_statements(database),
                         *schema_statements(schemas)):
                await conn.execute(stmt)
            moved = 0
            for service in SERVICES:
                moved += await give_schema(conn, schema_for(service), pg_role(service))
            moved += await give_schema(conn, VOLUMES_SCHEMA, VOLUMES_ROLE)
            if moved:
                changed.append(f"{moved} tables given to their service's role")
    finally:
        await conn.close()
    return changed
