"""Every manifest in k8s/ is a valid Kubernetes object: each document of each YAML file is validated
against the Kubernetes OpenAPI schema (kubernetes-validate, strict: unknown fields fail) of the
version the fake API uses, with a negative control that the check rejects a broken manifest. The
worker pod shown in k8s/examples/ is what the backend renders, and the RBAC and network policies
give the pool controller and the workers what the README says and no more.
"""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from fakes.fake_k8s_api import KUBE_VERSION, schema_errors

from levers9.pool_controller import backends_k8s_manifests as M
from levers9.pool_controller.pools import PoolConfig
from levers9.runtime.config import Settings

K8S = Path(__file__).resolve().parents[2] / "k8s"
FILES = sorted([*K8S.glob("*.yaml"), *K8S.glob("examples/*.yaml")])


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _all() -> dict[tuple[str, str, str], dict]:
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
            for p in FILES for d in _docs(p) if d.get("kind") != "Kustomization"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(K8S)))
def test_every_document_is_valid(path):
    docs = _docs(path)
    assert docs
    for doc in docs:
        if doc.get("kind") == "Kustomization":
            continue  # not a cluster object: kustomize's own file, checked below
        assert schema_errors(doc) == [], f"{path.name}: {doc['kind']}/{doc['metadata']['name']}"


def test_the_check_rejects_broken_manifests():
    deployment = next(d for d in _docs(K8S / "gateway.yaml") if d["kind"] == "Deployment")
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["envFrm"] = []
    assert schema_errors(typo)
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "one"
    assert schema_errors(wrong_type)
    no_name = copy.deepcopy(deployment)
    del no_name["spec"]["template"]["spec"]["containers"][0]["name"]
    assert schema_errors(no_name)
    assert schema_errors({"apiVersion": "v1", "kind": "NoSuchKind", "metadata": {"name": "x"}})
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, KUBE_VERSION, strict=True)


def test_kustomization_lists_resources_that_exist_and_sets_no_namespace():
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert "namespace" not in k, "kustomize would move levers9-workers objects into one namespace"
    for resource in k["resources"]:
        assert (K8S / resource).is_file()
        for doc in _docs(K8S / resource):
            assert doc["metadata"].get("namespace") in (None, "levers9", "levers9-workers")


def test_only_the_pool_controller_may_touch_pods_and_secrets_and_only_in_the_workers_namespace():
    objects = _all()
    assert not [k for k in objects if k[0] in ("ClusterRole", "ClusterRoleBinding")]
    role = objects[("Role", "levers9-workers", "levers9-pool-controller")]
    rules = {r: set(rule["verbs"]) for rule in role["rules"] for r in rule["resources"]}
    assert rules == {"pods": {"create", "get", "list", "watch", "delete"}, "secrets": {"create", "delete"}}
    binding = objects[("RoleBinding", "levers9-workers", "levers9-pool-controller")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pool-controller", "namespace": "levers9"}]
    for (kind, _, name), doc in objects.items():
        if kind in ("Deployment", "StatefulSet", "DaemonSet"):
            spec = doc["spec"]["template"]["spec"]
            if name == "pool-controller":
                assert spec["serviceAccountName"] == "pool-controller"
            else:
                assert spec.get("automountServiceAccountToken") is False, name


def test_workers_are_denied_by_default_and_reach_only_the_servers():
    objects = _all()
    deny = objects[("NetworkPolicy", "levers9-workers", "default-deny")]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    ingress = objects[("NetworkPolicy", "levers9-workers", "workers-ingress")]["spec"]["ingress"]
    assert ingress[0]["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "levers9"}}}]
    assert all("ports" in rule for rule in ingress[1:]), "workers reach each other only on the node-cache port"
    egress = objects[("NetworkPolicy", "levers9-workers", "workers-egress")]["spec"]["egress"]
    ports = {p["port"] for rule in egress for p in rule["ports"]}
    assert ports == {4222, 8080, 8081, 8333, 5432, 2050, 53}
    assert all(rule.get("to") for rule in egress), "no egress rule open to everything"
    selector = objects[("NetworkPolicy", "levers9-workers", "workers-ingress")]["spec"]["podSelector"]
    pod_labels = example_pod()["metadata"]["labels"]
    assert selector["matchLabels"].items() <= pod_labels.items(), "the policies select the backend's pods"


def test_nats_requires_credentials_and_each_service_mounts_its_own():
    objects = _all()
    conf = objects[("ConfigMap", "levers9", "levers9-nats")]["data"]["nats.conf"]
    assert "include ./auth/server.conf" in conf
    nats = objects[("StatefulSet", "levers9", "nats")]["spec"]["template"]["spec"]
    assert {"name": "auth", "secret": {"secretName": "levers9-nats-server"}} in nats["volumes"]
    for service in ("gateway", "scheduler", "pool-controller", "checkpoint-store", "image-builder"):
        spec = objects[("Deployment", "levers9", service)]["spec"]["template"]["spec"]
        secrets = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
        assert f"levers9-nats-{service}" in secrets, service
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        assert env["LEVERS9_NATS_CREDS"].endswith("nats.creds"), service
    controller = objects[("Deployment", "levers9", "pool-controller")]["spec"]["template"]["spec"]
    assert "LEVERS9_NATS_ISSUER" in {e["name"] for e in controller["containers"][0]["env"]}


def _configmap_settings() -> Settings:
    data = _all()[("ConfigMap", "levers9", "levers9-config")]["data"]
    return Settings.load(env={k: str(v) for k, v in data.items()}, profile=Path("/nonexistent/config.toml"))


def example_pod() -> dict:
    pools = _all()[("ConfigMap", "levers9", "levers9-pools")]["data"]["pools.toml"]
    import tomllib

    table = tomllib.loads(pools)["pools"]["h100"]
    return M.pod_manifest(PoolConfig("h100", **table), "h100-0193e7c25b1a", _configmap_settings(),
                          ["nats.creds", "signers.json", "worker.sign"])


def test_the_example_worker_pod_is_what_the_backend_renders():
    shown = _docs(K8S / "examples" / "worker-pod.yaml")
    assert shown == [example_pod()], "re-render k8s/examples/worker-pod.yaml (see its header)"


def test_pools_in_the_configmap_are_valid_kubernetes_pools():
    import tomllib

    pools = tomllib.loads(_all()[("ConfigMap", "levers9", "levers9-pools")]["data"]["pools.toml"])["pools"]
    secrets = {name for kind, ns, name in _all() if kind == "Secret" and ns == "levers9-workers"}
    assert "build" in pools
    for name, table in pools.items():
        pool = PoolConfig(name, **table)
        assert pool.backend == "kubernetes" and M.pool_problems(pool) == []
        assert pool.worker_secret in secrets


# ---- credentials: each service its own Secret, no password in these files ---------------------------

def test_no_secret_in_the_manifests_holds_a_value_and_each_service_names_only_its_own():
    from levers9.runtime.config import SERVICES

    secrets = {key: d for key, d in _all().items() if key[0] == "Secret"}
    assert all(v == "" for d in secrets.values() for v in (d.get("stringData") or {}).values()), \
        "a password in k8s/: generate it (python -m levers9.stack.deploy_secrets k8s) instead"
    for service in SERVICES:
        deployment = next(d for d in _docs(K8S / f"{service}.yaml") if d["kind"] in ("Deployment", "DaemonSet"))
        refs = {s["secretRef"]["name"] for c in deployment["spec"]["template"]["spec"]["containers"]
                for s in c.get("envFrom") or [] if "secretRef" in s}
        assert {r for r in refs if r.endswith("-credentials")} == {f"levers9-{service}-credentials"}, service
        assert ("Secret", "levers9", f"levers9-{service}-credentials") in secrets


def test_the_generated_secrets_fill_exactly_the_secrets_the_manifests_declare():
    from levers9.stack import credentials
    from levers9.stack.deploy_secrets import k8s_secrets

    creds = credentials.complete({})
    generated = {("Secret", d["metadata"]["namespace"], d["metadata"]["name"]): d for d in k8s_secrets(creds)}
    declared = {key: d for key, d in _all().items() if key[0] == "Secret" and key[2] != "levers9-keyring"}
    assert set(generated) == set(declared)
    for key, doc in generated.items():
        assert set(doc["stringData"]) == set(declared[key]["stringData"]), key
        assert all(doc["stringData"].values()), key
        assert schema_errors(doc) == []
    gateway = generated[("Secret", "levers9", "levers9-gateway-credentials")]["stringData"]
    assert gateway["LEVERS9_DATABASE_URL"].startswith("postgresql://levers9_gateway:")
