"""The deployment files (Dockerfile, docker-compose.yml, k8s/) stay in step with the code.

No network, no Docker, no Kubernetes: the files are parsed and checked against
`levers9.runtime.config` (the service names and the settings) and the repository's tree.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

try:
    from levers9.runtime.config import SERVICES, Settings
except ImportError:  # not installed: config.py is stdlib-only, so load it from its folder
    _spec = importlib.util.spec_from_file_location("_levers9_config", ROOT / "libs/runtime/config.py")
    _config = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = _config  # dataclasses resolve string annotations through it
    _spec.loader.exec_module(_config)
    SERVICES, Settings = _config.SERVICES, _config.Settings

COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
K8S = ROOT / "k8s"
SERVERS = ("nats", "postgres", "s3")
ENV_VAR = re.compile(r"\bLEVERS9_[A-Z0-9_]+\b")
HTTP_PORT = 8080


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _k8s_docs() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _workloads() -> dict[str, dict]:
    """levers9 service name -> its Deployment/DaemonSet, found by the container's `service NAME`."""
    found: dict[str, dict] = {}
    for _, doc in _k8s_docs():
        if doc.get("kind") not in ("Deployment", "DaemonSet", "StatefulSet"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            argv = list(container.get("command") or []) + list(container.get("args") or [])
            if argv[:1] == ["service"] and len(argv) == 2:
                assert argv[1] not in found, f"two workloads run `service {argv[1]}`"
                found[argv[1]] = doc
    return found


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs, with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


# --- the code -------------------------------------------------------------------------------------


def test_there_are_exactly_six_services():
    assert len(SERVICES) == 6
    assert len(set(SERVICES)) == 6
    assert set(SERVICES) == {"gateway", "scheduler", "pool-controller", "checkpoint-store",
                             "image-builder", "worker"}


# --- docker compose -------------------------------------------------------------------------------


def test_compose_runs_every_service_with_its_command():
    services = _compose()["services"]
    for name in SERVICES:
        assert name in services, f"compose lacks service {name}"
        assert services[name]["command"] == ["service", name]
        assert "build" in services[name], f"{name} is not built from the Dockerfile"
    for server in SERVERS:
        assert server in services, f"compose lacks server {server}"


def test_compose_depends_on_targets_exist_and_wait_for_health():
    services = _compose()["services"]
    for name, spec in services.items():
        deps = spec.get("depends_on") or {}
        targets = deps if isinstance(deps, list) else list(deps)
        for target in targets:
            assert target in services, f"{name} depends on unknown service {target}"
        if name in SERVICES:
            assert isinstance(deps, dict), f"{name}: depends_on needs conditions"
            for server in SERVERS:
                assert deps.get(server, {}).get("condition") == "service_healthy", (name, server)


def test_compose_healthchecks():
    services = _compose()["services"]
    for name, spec in services.items():
        assert spec.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name in SERVICES:
        test = " ".join(services[name]["healthcheck"]["test"])
        assert f"127.0.0.1:{HTTP_PORT}/healthz" in test, f"{name}: healthcheck must GET /healthz"


def test_compose_environment_is_shared_and_complete():
    services = _compose()["services"]
    required = {"LEVERS9_NATS_URL", "LEVERS9_DATABASE_URL", "LEVERS9_S3_ENDPOINT",
                "LEVERS9_S3_ACCESS_KEY", "LEVERS9_S3_SECRET_KEY", "LEVERS9_HTTP_HOST",
                "LEVERS9_HTTP_PORT", "LEVERS9_LOG_FORMAT"}
    for name in SERVICES:
        env = services[name]["environment"]
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        assert required <= set(env), f"{name} lacks {required - set(env)}"
        assert str(env["LEVERS9_HTTP_PORT"]) == str(HTTP_PORT)
        assert env["LEVERS9_HTTP_HOST"] == "0.0.0.0"
        assert env["LEVERS9_DATABASE_URL"].startswith("postgresql://")
        assert env["LEVERS9_DATABASE_URL"].endswith("/levers9")
    assert "x-levers9-env" in _compose()


def test_compose_gateway_is_published_and_worker_is_privileged():
    services = _compose()["services"]
    assert any(str(p).endswith(f":{HTTP_PORT}") for p in services["gateway"]["ports"])
    assert services["worker"].get("privileged") is True


def test_compose_named_volumes_are_declared():
    compose = _compose()
    declared = set(compose.get("volumes") or {})
    for name, spec in compose["services"].items():
        for volume in spec.get("volumes") or []:
            if isinstance(volume, str):
                # `${VAR:-default}:/path`: the default (a named volume, or a host folder when VAR is set)
                volume = re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", volume)
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source")
            if source and not source.startswith((".", "/", "~")):
                assert source in declared, f"{name} mounts undeclared volume {source}"


# --- every LEVERS9_* name is a setting ------------------------------------------------------------


@pytest.mark.parametrize("path", [DOCKERFILE, COMPOSE, *sorted(K8S.glob("*.yaml"))], ids=lambda p: p.name)
def test_every_levers9_variable_is_a_setting(path):
    used = set(ENV_VAR.findall(path.read_text()))
    unknown = used - set(Settings.env_names())
    assert not unknown, f"{path.name} uses variables Settings does not know: {sorted(unknown)}"


# --- kubernetes -----------------------------------------------------------------------------------


def test_k8s_files_parse_and_are_namespaced():
    docs = _k8s_docs()
    assert docs
    namespaces = [d for _, d in docs if d.get("kind") == "Namespace"]
    # levers9: the controlplane; levers9-workers: the pool controller's worker pods (k8s/rbac.yaml)
    assert [n["metadata"]["name"] for n in namespaces] == ["levers9", "levers9-workers"]
    for filename, doc in docs:
        if doc.get("kind") in ("Namespace", "Kustomization"):
            continue
        assert doc["metadata"].get("namespace") in ("levers9", "levers9-workers"), f"{filename}: {doc['kind']}"


def test_k8s_runs_every_service_with_its_command():
    workloads = _workloads()
    assert set(workloads) == {*SERVICES, "dashboard"}  # the six services and the dashboard (a client of the gateway)
    assert workloads["worker"]["kind"] == "DaemonSet"
    for name in (*SERVICES, "dashboard"):
        if name != "worker":
            assert workloads[name]["kind"] == "Deployment", name
        assert (K8S / f"{name}.yaml").exists()


def test_k8s_every_service_has_a_matching_service_object():
    workloads = _workloads()
    services = {d["metadata"]["name"]: d for _, d in _k8s_docs() if d.get("kind") == "Service"}
    for name, workload in workloads.items():
        assert name in services, f"no Service for {name}"
        selector = services[name]["spec"]["selector"]
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items(), f"Service {name} selects no pod of it"
        assert workload["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert any(p.get("targetPort") in (HTTP_PORT, "http") for p in services[name]["spec"]["ports"])


def test_k8s_probes_and_scrape_annotations():
    for name, workload in _workloads().items():
        template = workload["spec"]["template"]
        annotations = template["metadata"].get("annotations") or {}
        assert annotations.get("prometheus.io/scrape") == "true", name
        assert annotations.get("prometheus.io/path") == "/metrics", name
        assert annotations.get("prometheus.io/port") == str(HTTP_PORT), name
        for container in template["spec"]["containers"]:
            for probe in ("readinessProbe", "livenessProbe"):
                get = container[probe]["httpGet"]
                assert get["path"] == "/healthz", (name, probe)
                assert get["port"] == HTTP_PORT, (name, probe)


def test_k8s_worker_is_privileged():
    worker = _workloads()["worker"]
    for container in worker["spec"]["template"]["spec"]["containers"]:
        assert container["securityContext"]["privileged"] is True


def test_k8s_env_sources_exist():
    docs = [d for _, d in _k8s_docs()]
    config_maps = {d["metadata"]["name"] for d in docs if d.get("kind") == "ConfigMap"}
    secrets = {d["metadata"]["name"] for d in docs if d.get("kind") == "Secret"}
    for name, workload in _workloads().items():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            for source in container.get("envFrom") or []:
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in config_maps, name
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, name
    required = {"LEVERS9_NATS_URL", "LEVERS9_DATABASE_URL", "LEVERS9_S3_ENDPOINT",
                "LEVERS9_S3_ACCESS_KEY", "LEVERS9_S3_SECRET_KEY", "LEVERS9_HTTP_HOST",
                "LEVERS9_HTTP_PORT"}
    provided: set[str] = set()
    for doc in docs:
        if doc.get("kind") in ("ConfigMap", "Secret"):
            provided |= set(doc.get("data") or {}) | set(doc.get("stringData") or {})
    assert required <= provided, f"ConfigMap/Secret lack {required - provided}"


def test_k8s_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    on_disk = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk
    assert listed[:2] == ["namespace.yaml", "config.yaml"], "namespace and config come first"


def test_k8s_readme_exists():
    assert (K8S / "README.md").exists()


# --- the Dockerfile -------------------------------------------------------------------------------


def _copy_sources() -> list[str]:
    sources = []
    for word, rest in _dockerfile_instructions():
        if word == "COPY" and "--from=" not in rest:  # a stage's files are not the repo's
            args = [a for a in shlex.split(rest) if not a.startswith("--")]
            sources += args[:-1]
    return sources


def test_dockerfile_copy_sources_exist():
    sources = _copy_sources()
    assert sources
    for source in sources:
        if source == "README.md":
            continue  # checked on its own below
        assert (ROOT / source).exists(), f"Dockerfile copies {source}, which is not in the repo"


def test_dockerfile_copies_readme():
    assert "README.md" in _copy_sources()  # pyproject's `readme` needs it for `pip install .`
    if not (ROOT / "README.md").exists():
        pytest.skip("README.md not written yet")
    assert (ROOT / "README.md").is_file()


def test_dockerfile_copies_every_package_folder():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = pyproject["tool"]["setuptools"]["package-dir"].values()
    copied = [s.rstrip("/") for s in _copy_sources()]
    for folder in folders:
        assert any(folder == c or folder.startswith(c + "/") for c in copied), f"{folder} not copied"
    assert "pyproject.toml" in copied


def test_dockerfile_entrypoint_port_and_healthcheck():
    instructions = dict(_dockerfile_instructions())  # the last of each kind wins, as in Docker
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # the final stage: the local base (scripts/base_image.sh), or a registry's python image by --build-arg
    assert instructions["FROM"] == "${BASE}"
    args = dict(rest.split("=", 1) for word, rest in _dockerfile_instructions() if word == "ARG" and "=" in rest)
    assert args["BASE"] == "localhost/levers9-base:bookworm"
    assert args["BUILD_BASE"] == "localhost/levers9-base:bookworm-build"
    assert "--build-arg BASE=python:3.11-slim-bookworm" in DOCKERFILE.read_text()
    assert yaml.safe_load(instructions["ENTRYPOINT"]) == ["levers9"]
    assert "levers9" in pyproject["project"]["scripts"]
    assert yaml.safe_load(instructions["CMD"]) == ["service", "gateway"]
    assert str(HTTP_PORT) in instructions["EXPOSE"].split()
    assert f"127.0.0.1:{HTTP_PORT}/healthz" in instructions["HEALTHCHECK"]
    runs = [rest for word, rest in _dockerfile_instructions() if word == "RUN"]
    assert any(re.search(r"pip install (--no-deps )?\.", r) for r in runs)
    assert any("runc" in r and "criu" in r for r in runs), "the worker needs runc and CRIU"


def test_compose_runs_nats_with_authentication_and_each_process_as_its_own_user():
    services = _compose()["services"]
    assert services["nats-auth"]["command"][:3] == ["nats", "init", "/auth"]
    nats = services["nats"]
    assert nats["command"][-2:] == ["-c", "/auth/server.conf"]
    assert nats["depends_on"]["nats-auth"]["condition"] == "service_completed_successfully"
    for name in SERVICES:
        env = services[name]["environment"]
        assert env["LEVERS9_NATS_AUTH"] == "on" and env["LEVERS9_BUS_SIGNERS"] == "/auth/signers.json", name
        own = "workers/worker-1" if name == "worker" else name
        assert env["LEVERS9_NATS_CREDS"] == f"/auth/{own}.creds", name
        assert env["LEVERS9_BUS_SIGNING_KEY"] == f"/auth/{'worker' if name == 'worker' else name}.sign", name
        assert any(str(v).startswith("nats-auth:/auth") for v in services[name]["volumes"]), name
    # only the pool controller holds the issuer (it mints workers' users) and may write there
    assert [n for n in SERVICES if services[n]["environment"].get("LEVERS9_NATS_ISSUER")] == ["pool-controller"]
    assert "nats-auth:/auth" in services["pool-controller"]["volumes"]
