"""The manifest `levers9 clusters attach` prints, to apply in the attached cluster. Pure.

- a Namespace for the agent and its worker pods;
- a ServiceAccount for the agent, and a Role + RoleBinding that let it create, read, list, watch and
  delete pods and secrets in that namespace alone (no ClusterRole: nothing outside the namespace);
- a Secret with the join token (the only credential the cluster holds of the platform's: it opens
  this cluster's stream on the gateway and nothing else);
- a Deployment of one `levers9 agent` replica, which dials out to the gateway.
Worker pods also need the pool's Secret (`worker_secret` of the pool: its database role and S3 keys,
issued to this cluster by the platform team); the cluster's admin creates it in the same namespace.
"""

from __future__ import annotations

import base64
from typing import Any

import yaml

AGENT = "levers9-agent"
TOKEN_SECRET = "levers9-agent-token"


def _meta(name: str, namespace: str, cluster: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace,
            "labels": {"app.kubernetes.io/name": AGENT, "app.kubernetes.io/part-of": "levers9",
                       "levers9.io/cluster": cluster}}


def objects(cluster: str, token: str, gateway_url: str, namespace: str = AGENT,
            image: str = "levers9:0.1.0") -> list[dict[str, Any]]:
    """Every object to apply, in order."""
    meta = _meta(AGENT, namespace, cluster)
    rules = [{"apiGroups": [""], "resources": ["pods", "secrets"],
              "verbs": ["create", "get", "list", "watch", "delete"]}]
    env = [{"name": "LEVERS9_GATEWAY_URL", "value": gateway_url}, {"name": "LEVERS9_CLUSTER", "value": cluster},
           {"name": "LEVERS9_AGENT_NAMESPACE", "value": namespace},
           {"name": "LEVERS9_AGENT_TOKEN", "valueFrom": {"secretKeyRef": {"name": TOKEN_SECRET, "key": "token"}}}]
    container = {"name": "agent", "image": image, "imagePullPolicy": "IfNotPresent", "args": ["agent"], "env": env,
                 "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
                 "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "allowPrivilegeEscalation": False,
                                     "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}}
    labels = {"app.kubernetes.io/name": AGENT}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": meta["labels"]}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AGENT},
         "subjects": [{"kind": "ServiceAccount", "name": AGENT, "namespace": namespace}]},
        {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(TOKEN_SECRET, namespace, cluster), "type": "Opaque",
         "data": {"token": base64.b64encode(token.encode()).decode()}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
         "spec": {"replicas": 1, "strategy": {"type": "Recreate"},  # one stream per cluster
                  "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": {**meta["labels"], **labels}},
                               "spec": {"serviceAccountName": AGENT, "containers": [container]}}}},
    ]


def render(cluster: str, token: str, gateway_url: str, namespace: str = AGENT, image: str = "levers9:0.1.0") -> str:
    """The objects as one multi-document YAML."""
    return yaml.safe_dump_all(objects(cluster, token, gateway_url, namespace, image), sort_keys=False)
