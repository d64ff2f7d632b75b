"""`python -m levers9.stack.deploy_secrets compose|k8s`: what it writes is what docker-compose.yml and
k8s/ read, private, stable across runs, and the registry's passwords check against its htpasswd.

No server: files are written into a temporary folder and read back.
"""

from __future__ import annotations

import base64
import json
import re
import stat
from pathlib import Path

import bcrypt
import pytest
import yaml
from fakes.fake_k8s_api import schema_errors

from levers9.runtime.config import SERVICES
from levers9.stack import credentials
from levers9.stack import deploy_secrets as ds

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_VAR = re.compile(r"\$\{(L9_[A-Z0-9_]+):\?")  # the variables compose refuses to start without


def _dotenv(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _auth(text: str) -> dict[str, tuple[str, str]]:
    """host -> (user, password) of a containers auth file."""
    auths = json.loads(text)["auths"]
    return {host: tuple(base64.b64decode(a["auth"]).decode().split(":", 1)) for host, a in auths.items()}


def _htpasswd_checks(htpasswd: str, passwords: dict[str, str]) -> bool:
    hashes = dict(line.split(":", 1) for line in htpasswd.splitlines() if line)
    return set(hashes) == set(passwords) and all(
        bcrypt.checkpw(pw.encode(), hashes[user].encode()) for user, pw in passwords.items())


@pytest.fixture(scope="module")
def compose_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("compose")
    ds.compose(folder)
    return folder


# ---- compose --------------------------------------------------------------------------------------

def test_dotenv_has_every_variable_docker_compose_requires(compose_dir):
    env = _dotenv(compose_dir / ".env")
    required = set(COMPOSE_VAR.findall((ROOT / "docker-compose.yml").read_text()))
    assert required, "docker-compose.yml names no required variable"
    assert required <= set(env), f".env lacks {sorted(required - set(env))}"
    assert all(env[name] for name in required)
    for role in SERVICES:
        assert ds.env_name("PG_PASSWORD", role) in env, role
    assert env["L9_WORKER_TOKEN"] == (compose_dir / ds.STATE_DIR / "worker-token").read_text().strip()


def test_dotenv_passwords_are_the_kept_credentials(compose_dir):
    env = _dotenv(compose_dir / ".env")
    creds = credentials.ensure(compose_dir / ds.STATE_DIR)
    assert env["L9_PG_PASSWORD_GATEWAY"] == creds["postgres"]["gateway"]
    assert env["L9_S3_KEY_WORKER"] == creds["s3"]["worker"]["access_key"]
    assert env["L9_S3_SECRET_WORKER"] == creds["s3"]["worker"]["secret_key"]


def test_token_files_are_private_distinct_and_kept(compose_dir):
    state = compose_dir / ds.STATE_DIR
    tokens = {name: (state / name).read_text().strip() for name in ("token", "worker-token")}
    assert all(len(t) >= 32 for t in tokens.values()) and tokens["token"] != tokens["worker-token"]
    assert _mode(state / "token") == 0o600 and _mode(state / "worker-token") == 0o600
    assert _mode(compose_dir / ".env") == 0o600
    assert _mode(state) == 0o700, "the state folder keeps other users out of its 0644 files"


def test_registry_files_check_against_the_htpasswd(compose_dir):
    registry = compose_dir / ds.STATE_DIR / "registry"
    passwords = credentials.ensure(compose_dir / ds.STATE_DIR)["registry"]
    assert set(passwords) == {credentials.ADMIN, *credentials.REGISTRY_USERS}
    assert _htpasswd_checks((registry / "htpasswd").read_text(), passwords)
    for user, password in passwords.items():
        assert _auth((registry / f"auth-{user}.json").read_text()) == {ds.REGISTRY_HOST: (user, password)}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert compose["image-builder"]["environment"]["LEVERS9_REGISTRY"] == ds.REGISTRY_HOST
    assert compose["image-builder"]["environment"]["REGISTRY_AUTH_FILE"].endswith("auth-image-builder.json")


def test_running_compose_again_changes_nothing(tmp_path):
    ds.compose(tmp_path)
    names = [".env", f"{ds.STATE_DIR}/token", f"{ds.STATE_DIR}/worker-token", f"{ds.STATE_DIR}/s3.json",
             f"{ds.STATE_DIR}/keyring", f"{ds.STATE_DIR}/registry/htpasswd",
             f"{ds.STATE_DIR}/registry/auth-build.json"]
    before = {name: (tmp_path / name).read_text() for name in names}
    ds.compose(tmp_path)
    assert {name: (tmp_path / name).read_text() for name in names} == before


# ---- k8s ------------------------------------------------------------------------------------------

def _by_name(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs}


def test_k8s_registry_secrets_fill_registry_yaml(tmp_path):
    docs = _by_name(ds.k8s(tmp_path))
    creds = credentials.ensure(tmp_path / ds.K8S_STATE)
    registry = docs["levers9-registry"]["stringData"]
    assert _htpasswd_checks(registry["htpasswd"], creds["registry"])
    assert re.fullmatch(r"[0-9a-f]{64}", registry["http_secret"])
    auth = docs["levers9-registry-auth"]["stringData"]["auth-image-builder.json"]
    assert _auth(auth) == {ds.REGISTRY_K8S: ("image-builder", creds["registry"]["image-builder"])}
    for doc in docs.values():
        assert schema_errors(doc) == [], doc["metadata"]["name"]
    # the manifests mount these keys, and point the image-builder and the worker at this registry
    manifests = {d["metadata"]["name"]: d for d in yaml.safe_load_all((ROOT / "k8s/registry.yaml").read_text())
                 if d and d["kind"] == "Secret"}
    for name in ("levers9-registry", "levers9-registry-auth"):
        assert set(manifests[name]["stringData"]) == set(docs[name]["stringData"]), name
    for service in ("image-builder", "worker"):
        workload = next(d for d in yaml.safe_load_all((ROOT / f"k8s/{service}.yaml").read_text())
                        if d["kind"] in ("Deployment", "DaemonSet"))
        env = {e["name"]: e.get("value") for e in workload["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["LEVERS9_REGISTRY"] == ds.REGISTRY_K8S, service


def test_k8s_again_prints_the_same_secrets(tmp_path):
    first = yaml.safe_dump_all(ds.k8s(tmp_path))
    assert yaml.safe_dump_all(ds.k8s(tmp_path)) == first, "a second run would change the applied Secrets"
    assert _mode(tmp_path / ds.K8S_STATE / "registry" / "htpasswd") == 0o600


def test_registry_http_secret_is_derived_and_differs_per_stack():
    one, two = credentials.complete({}), credentials.complete({})
    assert ds.registry_http_secret(one) == ds.registry_http_secret(one)
    assert ds.registry_http_secret(one) != ds.registry_http_secret(two)
    assert one["registry"][credentials.ADMIN] not in ds.registry_http_secret(one)


def test_main_prints_the_k8s_secrets(tmp_path, capsys):
    assert ds.main(["k8s", str(tmp_path)]) == 0
    names = {d["metadata"]["name"] for d in yaml.safe_load_all(capsys.readouterr().out) if d}
    assert {"levers9-registry", "levers9-registry-auth", "levers9-gateway-credentials"} <= names
    assert ds.main(["nothing"]) == 2
