"""A FAKE cluster node, for the attached-cluster e2e test only: the fake Kubernetes API
(fake_k8s_api.py) and a fake kubelet in one process, run inside a host network namespace.

No Kubernetes runs on these machines. The fake kubelet does what a node would do with the worker
pods an agent creates through that API: for each new pod it starts a real worker process (`levers9
service worker`) in ANOTHER host namespace (`--worker-netns`: the node's network), with the pod's
environment: plain values as they are, secretKeyRefs read from the fake API's Secrets, the pod's
Secret volume written to a directory and the paths pointing into it rewritten, the hostPath home and
image cache mapped (the home to a directory under `--state`; the image cache is the machine's own), and the node's own addresses (levers9.runtime.hosts
host_env of that namespace). A pod deleted through the API gets SIGTERM; a worker that exits makes its
pod Failed with its exit code. It writes a kubeconfig for the agent and creates the pool's Secret
(`--pool-secret NAME` with `--pool-secret-json` values), as a cluster admin would.

Run: python tests/fakes/fake_kubelet.py --namespace NS --worker-netns l9h-2 --worker-address 10.210.0.3
       --state DIR --kubeconfig-out FILE --pool-secret levers9-pool --pool-secret-json FILE
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for `fakes`

from fakes.fake_k8s_api import FakeKubernetesAPI  # noqa: E402

SECRET_DIR = "/etc/levers9/worker"
# hostPath volumes: the node's levers9 home is a directory of this fake node; its image cache is this
# machine's (/var/cache/levers9 as it is: base root file systems shared by the machine's workers)
HOST_PATHS = {"/var/lib/levers9": "home"}


def secret_values(api: FakeKubernetesAPI, namespace: str, name: str) -> dict[str, str]:
    obj = api.objects("secrets", namespace).get(name) or {}
    return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}


def pod_env(api: FakeKubernetesAPI, namespace: str, pod: dict[str, Any], state: Path, files: Path) -> dict[str, str]:
    """The worker's environment as a node would give it (without the node's own addresses)."""
    container = pod["spec"]["containers"][0]
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]["secretKeyRef"]
        value = secret_values(api, namespace, ref["name"]).get(ref["key"])
        if value is None and not ref.get("optional"):
            raise RuntimeError(f"secret {ref['name']} has no key {ref['key']}")
        if value is not None:
            env[var["name"]] = value
    for vol in pod["spec"].get("volumes") or []:
        if "secret" in vol:
            files.mkdir(parents=True, exist_ok=True)
            for key, value in secret_values(api, namespace, vol["secret"]["secretName"]).items():
                (files / key).write_text(value)
                (files / key).chmod(0o600)
    for key, value in list(env.items()):
        if value.startswith(SECRET_DIR + "/"):
            env[key] = str(files / value[len(SECRET_DIR) + 1:])
        for host_path, local in HOST_PATHS.items():
            if value == host_path:
                env[key] = str(state / local)
                (state / local).mkdir(parents=True, exist_ok=True)
    return env


class Kubelet:
    def __init__(self, api: FakeKubernetesAPI, args: argparse.Namespace) -> None:
        self.api, self.args = api, args
        self.procs: dict[str, subprocess.Popen] = {}
        self.state = Path(args.state)

    def node_env(self) -> dict[str, str]:
        from levers9.runtime import hosts

        n = hosts.index_of(self.args.worker_netns)
        assert n is not None
        plan = hosts.host_plan(n, self.args.hosts_subnet, self.args.supernet)
        return hosts.host_env(plan, {}, self.args.hosts_subnet, self.state)

    def start(self, name: str, pod: dict[str, Any]) -> None:
        ns = self.args.namespace
        env = {**pod_env(self.api, ns, pod, self.state / "pods" / name, self.state / "pods" / name / "secret"),
               **self.node_env(), "PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"}
        cmd = ["nsenter", f"--net=/run/netns/{self.args.worker_netns}", "--", sys.executable, "-m", "levers9",
               *pod["spec"]["containers"][0].get("args", [])]
        log = (self.state / f"worker-{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        self.api.set_phase(ns, name, "Running")
        print(f"fake kubelet: started pod {name} (pid {self.procs[name].pid})", flush=True)

    def step(self) -> None:
        pods = self.api.objects("pods", self.args.namespace)
        for name, pod in pods.items():
            if name not in self.procs and (pod.get("status") or {}).get("phase", "Pending") == "Pending":
                try:
                    self.start(name, pod)
                except Exception as e:  # noqa: BLE001 - a pod that cannot start fails, as on a node
                    print(f"fake kubelet: pod {name} failed to start: {e}", flush=True)
                    self.api.set_phase(self.args.namespace, name, "Failed", exit_code=128, reason=str(e)[:60])
        for name, proc in list(self.procs.items()):
            if name not in pods:  # deleted through the API: stop its worker gracefully
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                del self.procs[name]
            elif proc.poll() is not None:
                self.api.set_phase(self.args.namespace, name, "Failed", exit_code=proc.returncode, reason="Error")
                del self.procs[name]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("--namespace", "--worker-netns", "--state", "--kubeconfig-out", "--pool-secret",
                 "--pool-secret-json"):
        p.add_argument(flag, required=True)
    p.add_argument("--hosts-subnet", default="10.210.0.0/24")
    p.add_argument("--supernet", default="10.209.0.0/16")
    args = p.parse_args()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    with FakeKubernetesAPI() as api:
        Path(args.kubeconfig_out).write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}]}))
        values = json.loads(Path(args.pool_secret_json).read_text())
        _create_secret(api, args.namespace, args.pool_secret, values)
        kubelet = Kubelet(api, args)
        print(f"fake cluster: API at {api.url}", flush=True)
        try:
            while not stopping:
                kubelet.step()
                time.sleep(0.3)
        finally:
            kubelet.stop()


def _create_secret(api: FakeKubernetesAPI, namespace: str, name: str, values: dict[str, str]) -> None:
    import httpx

    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
            "type": "Opaque", "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}}
    r = httpx.post(f"{api.url}/api/v1/namespaces/{namespace}/secrets", json=body, timeout=10)
    r.raise_for_status()


if __name__ == "__main__":
    main()
