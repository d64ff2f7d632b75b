"""The stack's credentials, without servers: who is given what (role_env), the servers' auth files
(pg_hba.conf, pg_ident.conf, SeaweedFS identities, htpasswd) and the roles' SQL."""

from __future__ import annotations

import json
import stat

import bcrypt
from hypothesis import given
from hypothesis import strategies as st

from levers9.runtime.config import SERVICES, Settings
from levers9.runtime.credentials import STRIPPED, without_credentials, worker_env, worker_file
from levers9.stack import credentials, pg_roles, postgres, registry, s3
from levers9.stack.procs import redact

ADMIN_DSN = "postgresql://postgres:adminpw@127.0.0.1:5432/levers9"


def given_all(**changes) -> credentials.Given:
    base = credentials.Given(admin_dsn=ADMIN_DSN, own_postgres=True, own_s3=True,
                             registry_auth_files={"build": "/h/credentials/registry-build.json",
                                                  "image-builder": "/h/credentials/registry-image-builder.json"},
                             keyring={"LEVERS9_SECRET_KEY_FILE": "/h/keys.json"}, worker_credentials="/h/credentials",
                             worker_token="wt")
    return base._replace(**changes)


CREDS = credentials.complete({})


def test_every_role_gets_its_own_database_role_and_nothing_of_the_others():
    envs = {role: credentials.role_env(role, CREDS, given_all()) for role in SERVICES}
    for role, env in envs.items():
        assert env["LEVERS9_DATABASE_URL"] == \
            f"postgresql://{credentials.pg_role(role)}:{CREDS['postgres'][role]}@127.0.0.1:5432/levers9"
        others = [CREDS["postgres"][r] for r in SERVICES if r != role] + [CREDS["postgres"]["admin"]]
        assert not any(pw in json.dumps(env) for pw in others), role
    assert set(envs["pool-controller"]) == {"LEVERS9_DATABASE_URL", "LEVERS9_WORKER_CREDENTIALS"}
    assert [r for r, e in envs.items() if "LEVERS9_WORKER_TOKEN" in e] == ["worker"]
    assert [r for r, e in envs.items() if "REGISTRY_AUTH_FILE" in e] == ["image-builder"]
    assert {r for r, e in envs.items() if "LEVERS9_SECRET_KEY_FILE" in e} == {"gateway", "checkpoint-store", "worker"}
    keys = {e["LEVERS9_S3_ACCESS_KEY"] for e in envs.values() if "LEVERS9_S3_ACCESS_KEY" in e}
    assert len(keys) == 5 and CREDS["s3"]["admin"]["access_key"] not in keys


def test_only_the_build_pools_workers_get_the_registry():
    build = credentials.role_env("worker", CREDS, given_all(), pool="build")
    other = credentials.role_env("worker", CREDS, given_all(), pool="default")
    assert build["REGISTRY_AUTH_FILE"].endswith("registry-build.json") and "REGISTRY_AUTH_FILE" not in other


def test_external_servers_credentials_go_to_every_role_as_given():
    ext = {"LEVERS9_DATABASE_URL": "postgresql://shared@db/levers9", "LEVERS9_S3_ACCESS_KEY": "k",
           "LEVERS9_S3_SECRET_KEY": "s"}
    g = given_all(own_postgres=False, own_s3=False, external=ext, registry_auth_files={})
    for role in SERVICES:
        env = credentials.role_env(role, CREDS, g)
        assert env["LEVERS9_DATABASE_URL"] == ext["LEVERS9_DATABASE_URL"]
        assert ("LEVERS9_S3_SECRET_KEY" in env) == (role != "pool-controller")
        assert "REGISTRY_AUTH_FILE" not in env


def test_completing_keeps_what_exists_and_generates_the_rest():
    partial = {"postgres": {"admin": "kept"}}
    full = credentials.complete(partial)
    assert full["postgres"]["admin"] == "kept"
    assert set(full["postgres"]) == {"admin", *SERVICES}
    assert set(full["registry"]) == {"admin", "build", "image-builder"}
    assert credentials.complete(full) == full
    assert credentials.complete({})["postgres"]["gateway"] != full["postgres"]["gateway"]


def test_ensure_writes_owner_only_files(tmp_path):
    creds = credentials.ensure(tmp_path)
    path = credentials.credentials_dir(tmp_path) / "stack.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert credentials.ensure(tmp_path) == creds  # stable across starts


@given(st.dictionaries(st.sampled_from([*STRIPPED, "LEVERS9_NATS_URL", "PATH", "LEVERS9_HOME"]), st.text(max_size=5)))
def test_without_credentials_keeps_only_what_carries_none(env):
    kept = without_credentials(env)
    assert not set(kept) & set(STRIPPED)
    assert {k: v for k, v in env.items() if k not in STRIPPED} == kept


def test_worker_env_files_per_pool(tmp_path):
    worker_file(tmp_path, "").write_text(json.dumps({"LEVERS9_DATABASE_URL": "w"}))
    worker_file(tmp_path, "build").write_text(json.dumps({"LEVERS9_DATABASE_URL": "w", "REGISTRY_AUTH_FILE": "f"}))
    assert worker_env(str(tmp_path), "gpu") == {"LEVERS9_DATABASE_URL": "w"}
    assert worker_env(str(tmp_path), "build")["REGISTRY_AUTH_FILE"] == "f"
    assert worker_env("", "build") == {}


def test_pg_hba_has_no_trust_and_peer_only_for_the_superuser():
    text = postgres.hba_text("10.210.0.0/24")
    rules = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert not any("trust" in rule for rule in rules)
    assert [r for r in rules if "peer" in r] == [["local", "all", "postgres", "peer", "map=levers9"]]
    assert all(r[-1] == "scram-sha-256" or "peer" in r or r[-1] == "hosts" for r in rules)
    assert any("10.210.0.0/24" in r for r in rules)
    assert postgres.ident_text(["embedded_postgres", "root", "root"]) == \
        "levers9  embedded_postgres  postgres\nlevers9  root  postgres\n"


def test_roles_sql_gives_each_schema_to_its_role_and_closes_public():
    sql = pg_roles.role_statements(CREDS["postgres"], {"postgres"})
    assert sum(s.startswith("CREATE ROLE levers9_") and "NOSUPERUSER" in s for s in sql) == len(SERVICES)
    assert sql[0].startswith("ALTER ROLE postgres PASSWORD")
    again = pg_roles.role_statements(CREDS["postgres"], {"postgres", *map(credentials.pg_role, SERVICES),
                                                          credentials.VOLUMES_ROLE})
    assert not any(s.startswith("CREATE ROLE") for s in again)
    schemas = pg_roles.schema_statements(set())
    assert "CREATE SCHEMA scheduler AUTHORIZATION levers9_scheduler" in schemas
    assert "CREATE SCHEMA juicefs AUTHORIZATION levers9_volumes" in schemas
    assert "REVOKE ALL ON DATABASE levers9 FROM PUBLIC" in pg_roles.database_statements("levers9")
    assert pg_roles.literal("it's") == "'it''s'"


def test_s3_identities_one_key_per_role_with_only_its_actions():
    doc = s3.identities(CREDS, "levers9-volumes")
    by_name = {i["name"]: i for i in doc["identities"]}
    assert set(by_name) == {"admin", "gateway", "scheduler", "checkpoint-store", "image-builder", "worker"}
    assert "Admin" in by_name["admin"]["actions"]
    assert not any(a in ("Admin", "Write", "Read") for n in by_name if n != "admin" for a in by_name[n]["actions"])
    assert not any(a.startswith("Write") and a != "Write:levers9-volumes" for a in by_name["worker"]["actions"])
    assert by_name["scheduler"]["actions"] == ["Read:levers9-platform", "List:levers9-platform"]
    keys = [c["accessKey"] for i in doc["identities"] for c in i["credentials"]]
    assert len(set(keys)) == len(keys) and "levers9" not in keys


def test_htpasswd_is_bcrypt_and_auth_files_name_every_address(tmp_path):
    text = registry.htpasswd_text({"build": "pw1"}, rounds=4)
    user, hashed = text.strip().split(":", 1)
    assert user == "build" and bcrypt.checkpw(b"pw1", hashed.encode())
    auth = json.loads(credentials.registry_auth(["127.0.0.1:5000", "10.210.0.1:5000"], "build", "pw1"))
    assert set(auth["auths"]) == {"127.0.0.1:5000", "10.210.0.1:5000"}
    path = tmp_path / "htpasswd"
    registry.write_htpasswd(path, {"build": "pw1"})
    before = path.read_text()
    registry.write_htpasswd(path, {"build": "pw1"})  # unchanged passwords: not rewritten (salted anew)
    assert path.read_text() == before and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_redact_hides_only_the_password():
    assert redact(ADMIN_DSN) == "postgresql://postgres:***@127.0.0.1:5432/levers9"
    assert redact("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"


def test_a_service_never_takes_credentials_from_the_profile(tmp_path):
    profile = tmp_path / "config.toml"
    profile.write_text('s3_access_key = "ADMIN"\ntoken = "l9_admin"\nworker_token = "wt"\nnats_auth = "on"\n')
    client = Settings.load(env={"LEVERS9_HOME": str(tmp_path)})
    service = Settings.load(env={"LEVERS9_HOME": str(tmp_path), "LEVERS9_SERVICE": "gateway"})
    assert (client.storage.s3_access_key, client.client.token, client.worker.token) == ("ADMIN", "l9_admin", "wt")
    assert (service.storage.s3_access_key, service.client.token, service.worker.token) == ("", "", "")
    assert service.bus.auth is True  # what is not a credential still comes from the profile


def test_compose_takes_every_credential_from_the_generated_env(tmp_path):
    import re
    from pathlib import Path

    import yaml

    from levers9.stack import deploy_secrets

    text = (Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text()
    assert "levers9-secret" not in text and "POSTGRES_PASSWORD: levers9" not in text
    services = yaml.safe_load(text)["services"]
    for name in SERVICES:
        dsn = services[name]["environment"]["LEVERS9_DATABASE_URL"]
        assert dsn.startswith(f"postgresql://{credentials.pg_role(name)}:${{L9_PG_PASSWORD_"), name
    deploy_secrets.compose(tmp_path)
    dotenv = dict(line.split("=", 1) for line in (tmp_path / ".env").read_text().splitlines() if "=" in line)
    assert set(re.findall(r"\$\{(L9_[A-Z0-9_]+):\?", text)) <= set(dotenv)
    assert stat.S_IMODE((tmp_path / ".env").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / deploy_secrets.STATE_DIR).stat().st_mode) == 0o700
    before = (tmp_path / ".env").read_text()
    deploy_secrets.compose(tmp_path)  # again: the same values
    assert (tmp_path / ".env").read_text() == before
