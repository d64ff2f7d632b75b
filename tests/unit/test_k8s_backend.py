"""The Kubernetes pool backend, against a FAKE Kubernetes API (tests/fakes/fake_k8s_api.py) that
validates every object the official client sends against the Kubernetes 1.32 schema.

Pure parts (manifests, environment, which pods are gone) have property tests; the backend's
behaviour goes through the real client over HTTP: pods and secrets created and deleted, failed and
vanished pods reported, API errors turned into clear messages, and the controller's own path
(provision, idle stop, lost) driven with a fake bus and database.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.error
import urllib.request

import pytest
from fakes.fake_k8s_api import FakeKubernetesAPI, schema_errors
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client
from settings_strategies import CREDENTIALS, MARK, any_settings

from levers9.pool_controller import backends_k8s
from levers9.pool_controller import backends_k8s_manifests as M
from levers9.pool_controller.backend_choice import make_backend
from levers9.pool_controller.backends_k8s import KubernetesBackend
from levers9.pool_controller.pools import PoolConfig
from levers9.runtime import nats_auth, nats_jwt
from levers9.runtime.config import Settings
from levers9.runtime.nats_issuer import Issuer

NS = "levers9-workers"
# Settings that are credentials of the platform: no worker pod may get one from the controller
SETTINGS = Settings().with_(nats_url="nats://nats.levers9.svc:4222", gateway_url="http://gateway.levers9.svc:8080",
                    s3_endpoint="http://s3.levers9.svc:8333", **{c: MARK + c for c in CREDENTIALS})
GPU_POOL = PoolConfig("gpu", backend="kubernetes", gpu_type="H100", gpus_per_worker=2, worker_cpu_millicores=4000,
                      worker_memory_mib=8192, worker_secret="levers9-pool-gpu", min_warm=0, idle_timeout_s=0)


def test_credentials_are_settings_and_none_is_allowed():
    names = set(Settings.names())
    assert set(CREDENTIALS) <= names
    assert set(M.WORKER_SETTINGS) <= names
    assert not set(CREDENTIALS) & set(M.WORKER_SETTINGS)


# ---- pure parts ----------------------------------------------------------------------------------

_label_value = st.from_regex(r"\A[A-Za-z0-9]([A-Za-z0-9_.-]{0,20}[A-Za-z0-9])?\Z")


@st.composite
def pools(draw) -> PoolConfig:
    return PoolConfig(draw(st.from_regex(r"\A[a-z][a-z0-9_-]{0,15}\Z")), backend="kubernetes",
                      gpu_type=draw(st.one_of(st.just(""), _label_value)), gpus_per_worker=draw(st.integers(0, 8)),
                      gpu_limits=draw(st.booleans()), worker_cpu_millicores=draw(st.integers(0, 64000)),
                      worker_memory_mib=draw(st.integers(0, 512 * 1024)), criu=draw(st.booleans()),
                      worker_secret=draw(st.sampled_from(["", "levers9-pool-x"])),
                      gpu_label=draw(st.sampled_from(["levers9.io/gpu-type", "nvidia.com/gpu.product"])))


@settings(max_examples=60, deadline=None)
@given(any_settings(), pools())
def test_no_platform_credential_reaches_a_worker_pod(s, pool):
    env = M.worker_env(s)
    pod = M.pod_manifest(pool, "w-1", s, ["nats.creds", "worker.sign", "signers.json"])
    assert MARK not in json.dumps(env) and MARK not in json.dumps(pod)
    assert set(env) <= {f"LEVERS9_{n.upper()}" for n in M.WORKER_SETTINGS}
    container = pod["spec"]["containers"][0]
    for var in container["env"]:  # credentials only by reference: the pool's Secret or its own
        if var["name"] in M.POOL_SECRET_KEYS.values():
            assert var["valueFrom"]["secretKeyRef"]["name"] == pool.worker_secret
    assert pod["spec"]["automountServiceAccountToken"] is False


@settings(max_examples=40, deadline=None)
@given(pools(), st.from_regex(r"\A[a-z][a-z0-9-]{0,30}\Z"))
def test_pod_follows_the_pool_and_is_valid(pool, worker_id):
    pod = M.pod_manifest(pool, worker_id, SETTINGS, [])
    assert schema_errors(pod) == []
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert container["securityContext"]["privileged"] is True
    if pool.gpu_type:
        assert spec["nodeSelector"] == {pool.gpu_label: pool.gpu_type}
    else:
        assert "nodeSelector" not in spec
    limits = container["resources"].get("limits", {})
    if pool.gpu_limits and pool.gpus_per_worker:
        assert limits == {"nvidia.com/gpu": str(pool.gpus_per_worker)}
    else:
        assert "nvidia.com/gpu" not in limits
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LEVERS9_WORKER_ID"] == worker_id and env["LEVERS9_WORKER_POOL"] == pool.name
    assert env["LEVERS9_WORKER_GPU_COUNT"] == str(pool.gpus_per_worker)
    assert {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v} == {M.HOME, M.IMAGE_CACHE}
    assert pod["metadata"]["annotations"][M.ANNOTATION_WORKER] == worker_id


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), st.text(max_size=80))
def test_object_names_are_dns_labels_and_distinct(a, b):
    for wid in (a, b):
        name = M.object_name(wid)
        assert len(name) <= 63 and M._LABEL_KEY.match(name) and name == name.lower()
        value = M.label_value(wid)
        assert len(value) <= 63 and M._LABEL_VALUE.match(value)
    assert (M.object_name(a) == M.object_name(b)) == (a == b)


_phases = st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown", "DELETING", "MISSING"])


@given(st.dictionaries(st.from_regex(r"\Aw[0-9]{1,3}\Z"), _phases, max_size=8))
def test_gone_workers_are_the_known_ones_failed_finished_deleted_or_missing(phases):
    pods = [{"metadata": {"annotations": {M.ANNOTATION_WORKER: w},
                          **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if p == "DELETING" else {})},
             "status": {"phase": p}} for w, p in phases.items() if p != "MISSING"]
    pods.append({"metadata": {"annotations": {M.ANNOTATION_WORKER: "someone-else"}}, "status": {"phase": "Failed"}})
    gone = M.gone_workers(set(phases), pods)
    assert set(gone) == {w for w, p in phases.items() if p in ("Succeeded", "Failed", "DELETING", "MISSING")}


def test_pool_problems_name_what_to_fix():
    assert M.pool_problems(GPU_POOL) == []
    assert "worker_secret" in M.pool_problems(PoolConfig("p", backend="kubernetes"))[0]
    bad = PoolConfig("p", backend="kubernetes", worker_secret="s", gpu_type="H100 80GB", gpu_label="bad label")
    assert len(M.pool_problems(bad)) == 2


# ---- the backend over HTTP -----------------------------------------------------------------------


@pytest.fixture
def fake():
    with FakeKubernetesAPI() as api:
        yield api


@pytest.fixture
def issuer(tmp_path) -> Issuer:
    iss = Issuer(tmp_path / "auth")
    iss.ensure()
    return iss


def _api(url: str) -> client.CoreV1Api:
    cfg = client.Configuration()
    cfg.host = url
    return client.CoreV1Api(client.ApiClient(cfg))


@pytest.fixture
def backend(fake, issuer):
    # a generous ceiling: the fake API server is a thread of this loaded process (one read took over 5 s
    # beside a CI run: "Read timed out"); the unreachable server's refusal has a backend of its own
    b = KubernetesBackend(SETTINGS, str(issuer.dir), _api(fake.url), watch_timeout_s=1, request_timeout_s=60)
    yield b
    b.close()


def _secret_files(secret: dict) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def _wait_exited(backend: KubernetesBackend, timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gone = backend.exited()
        if gone:
            return gone
        time.sleep(0.05)
    return []


def test_start_creates_its_secret_and_a_valid_privileged_pod(fake, backend, issuer):
    backend.start_worker(GPU_POOL, "gpu-0001", "tok-0001")
    assert backend.errors == type(backend.errors)() and backend.exited() == []
    assert fake.state.received and all(schema_errors(o) == [] for o in fake.state.received)
    name = M.object_name("gpu-0001")
    pod, secret = fake.objects("pods", NS)[name], fake.objects("secrets", NS)[name]
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert container["securityContext"] == {"privileged": True}
    assert spec["nodeSelector"] == {"levers9.io/gpu-type": "H100"}
    assert container["resources"] == {"requests": {"cpu": "4000m", "memory": "8192Mi"},
                                      "limits": {"nvidia.com/gpu": "2"}}
    assert {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v} == {
        "home": "/var/lib/levers9", "image-cache": "/var/cache/levers9"}
    assert pod["metadata"]["labels"][M.LABEL_POOL] == "gpu" and pod["metadata"]["labels"][M.LABEL_WORKER] == "gpu-0001"
    assert MARK not in json.dumps(pod) and MARK not in json.dumps(secret)
    env = {e["name"]: e for e in container["env"]}
    assert env["LEVERS9_NATS_URL"]["value"] == SETTINGS.bus.nats_url
    assert env["LEVERS9_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "levers9-pool-gpu", "key": "database_url", "optional": False}
    assert env["LEVERS9_WORKER_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": name, "key": "token"}
    files = _secret_files(secret)
    assert files["token"] == "tok-0001"
    user = nats_jwt.decode(nats_jwt.creds_jwt(files["nats.creds"]))
    assert user["name"] == nats_auth.worker_tag("gpu-0001")  # its own user, not the controller's
    assert "gpu-0001" in json.dumps(user["nats"]["pub"]) and "gpu-0002" not in json.dumps(user["nats"]["pub"])
    held = "".join(files.values())
    for private in ("signing.seed", "account.seed", "operator.seed", "pool-controller.creds", "admin.creds"):
        assert (issuer.dir / private).read_text().strip() not in held


def test_each_worker_gets_a_user_of_its_own(fake, backend):
    backend.start_worker(GPU_POOL, "gpu-a", "t")
    backend.start_worker(GPU_POOL, "gpu-b", "t")
    users = {nats_jwt.decode(nats_jwt.creds_jwt(_secret_files(s)["nats.creds"]))["sub"]
             for s in fake.objects("secrets", NS).values()}
    assert len(users) == 2


def test_a_pool_without_gpu_limits_or_gpus(fake, backend):
    backend.start_worker(PoolConfig("cpu", backend="kubernetes", worker_secret="s", gpu_type="A10", gpus_per_worker=1,
                                    gpu_limits=False), "cpu-1", "t")
    backend.start_worker(PoolConfig("cpu", backend="kubernetes", worker_secret="s"), "cpu-2", "t")
    pods = fake.objects("pods", NS)
    one, two = pods[M.object_name("cpu-1")]["spec"], pods[M.object_name("cpu-2")]["spec"]
    assert one["nodeSelector"] == {"levers9.io/gpu-type": "A10"} and "limits" not in one["containers"][0]["resources"]
    assert "nodeSelector" not in two and two["containers"][0]["resources"] == {}


def test_stop_deletes_pod_and_secret_gracefully_and_is_not_reported(fake, backend):
    backend.start_worker(GPU_POOL, "gpu-1", "t")
    backend.stop_worker("gpu-1")
    assert fake.objects("pods", NS) == {} and fake.objects("secrets", NS) == {}
    pod_delete = [q for res, _, _, q in fake.state.deletes if res == "pods"]
    assert pod_delete == [{"gracePeriodSeconds": [str(M.GRACE_S)]}]
    time.sleep(0.3)
    assert backend.exited() == []
    backend.stop_worker("gpu-1")  # again, or unknown: nothing to do
    backend.stop_worker("nobody")
    assert not backend.errors


@pytest.mark.parametrize("how", ["failed", "deleted", "succeeded"])
def test_a_pod_that_fails_or_vanishes_is_reported_once_and_cleaned_up(fake, backend, how):
    backend.start_worker(GPU_POOL, "gpu-1", "t")
    backend.start_worker(GPU_POOL, "gpu-2", "t")
    name = M.object_name("gpu-1")
    fake.set_phase(NS, name, "Running")
    if how == "deleted":
        fake.delete_out_of_band("pods", NS, name)
    else:
        fake.set_phase(NS, name, "Failed" if how == "failed" else "Succeeded", exit_code=137, reason="OOMKilled")
    assert _wait_exited(backend) == ["gpu-1"]
    deadline = time.monotonic() + 3
    while name in fake.objects("secrets", NS) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert name not in fake.objects("secrets", NS) and name not in fake.objects("pods", NS)
    assert M.object_name("gpu-2") in fake.objects("pods", NS)
    time.sleep(0.3)
    assert backend.exited() == []


def test_a_relist_finds_a_pod_deleted_while_nobody_watched(fake, issuer):
    b = KubernetesBackend(SETTINGS, str(issuer.dir), _api(fake.url), watch_timeout_s=1)
    b.stopping.set()  # no watcher thread: refresh() alone
    b.start_worker(GPU_POOL, "gpu-1", "t")
    fake.delete_out_of_band("pods", NS, M.object_name("gpu-1"))
    assert b.exited() == []
    b.refresh(NS)
    assert b.exited() == ["gpu-1"]


@pytest.mark.parametrize("status,words", [(409, "already exists"), (500, "API server failed"), (403, "rbac")])
def test_api_errors_are_clear_and_the_worker_is_reported(fake, backend, status, words):
    fake.fail_next("POST", "pods", status, message="boom")
    backend.start_worker(GPU_POOL, "gpu-1", "t")  # does not raise
    assert backend.exited() == ["gpu-1"]
    assert f"HTTP {status}" in backend.errors[-1] and words in backend.errors[-1] and "boom" in backend.errors[-1]
    assert fake.objects("secrets", NS) == {}, "the token must not outlive a failed start"


def test_forbidden_namespace_and_unreachable_server(fake, backend, issuer):
    fake.forbid(NS)
    backend.start_worker(GPU_POOL, "gpu-1", "t")
    assert backend.exited() == ["gpu-1"] and "HTTP 403" in backend.errors[-1] and "cannot post" in backend.errors[-1]
    down = KubernetesBackend(SETTINGS, "", _api("http://127.0.0.1:9"), request_timeout_s=2)
    down.stopping.set()
    down.start_worker(GPU_POOL, "gpu-2", "t")
    assert down.exited() == ["gpu-2"] and "unreachable" in down.errors[-1]


def _broken(change):
    def make(*args, **kw):
        pod = M.pod_manifest(*args, **kw)
        change(pod)
        return pod
    return make


def test_an_object_the_server_finds_invalid_gets_422_and_a_clear_error(fake, backend, monkeypatch):
    # the client's own model takes any string as a name; the API server (here the fake) does not
    monkeypatch.setattr(backends_k8s, "pod_manifest", _broken(lambda p: p["metadata"].update(name="Not_A_DNS_Name")))
    backend.start_worker(GPU_POOL, "gpu-1", "t")
    assert backend.exited() == ["gpu-1"]
    assert "HTTP 422" in backend.errors[-1] and "Not_A_DNS_Name" in backend.errors[-1]
    assert fake.objects("pods", NS) == {} and fake.objects("secrets", NS) == {}


def test_an_object_the_client_refuses_is_a_clear_error_not_a_crash(fake, backend, monkeypatch):
    typo = _broken(lambda p: p["spec"]["containers"][0].update(privilegd=True))
    monkeypatch.setattr(backends_k8s, "pod_manifest", typo)
    backend.start_worker(GPU_POOL, "gpu-1", "t")
    assert backend.exited() == ["gpu-1"]
    assert "refused the object" in backend.errors[-1] and "privilegd" in backend.errors[-1]
    assert fake.objects("secrets", NS) == {}


def test_the_fake_itself_answers_422_for_a_schema_invalid_object(fake):
    # the client's model would stop this one first, so send it raw: the fake's schema check must hold
    pod = M.pod_manifest(GPU_POOL, "gpu-1", SETTINGS, [])
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    request = urllib.request.Request(f"{fake.url}/api/v1/namespaces/{NS}/pods", json.dumps(pod).encode(),
                                     {"Content-Type": "application/json"}, method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=60)
    status = json.loads(e.value.read())
    assert e.value.code == 422 and status["reason"] == "Invalid" and "containerPort" in status["message"]
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = 8080
    request.data = json.dumps(pod).encode()
    assert urllib.request.urlopen(request, timeout=60).status == 201


def test_a_misconfigured_pool_sends_nothing(fake, backend):
    backend.start_worker(PoolConfig("p", backend="kubernetes"), "p-1", "t")
    assert backend.exited() == ["p-1"] and "worker_secret" in backend.errors[-1]
    assert fake.state.received == []


def test_make_backend_reads_a_kubeconfig(fake, tmp_path, monkeypatch):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": fake.url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("LEVERS9_HOME", str(tmp_path))
    monkeypatch.setenv("LEVERS9_NATS_URL", "nats://nats.example:4222")
    b = make_backend("kubernetes", tmp_path, "")
    try:
        b.start_worker(GPU_POOL, "gpu-1", "t")
        pod = fake.objects("pods", NS)[M.object_name("gpu-1")]
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["LEVERS9_NATS_URL"] == "nats://nats.example:4222" and "LEVERS9_NATS_CREDS" not in env
    finally:
        b.close()  # type: ignore[attr-defined]
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(SystemExit, match="KUBECONFIG"):
        make_backend("kubernetes", tmp_path, "")


# ---- the controller's path -----------------------------------------------------------------------


class FakeDB:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    async def fetch(self, sql: str, *args):
        return [r for r in self.rows if "WHERE pool" not in sql or r["pool"] == args[0]]

    async def fetchval(self, sql: str, *args):
        return 0


class FakeBus:
    def __init__(self) -> None:
        self.published: list = []

    async def publish(self, env) -> None:
        self.published.append(env)

    async def append(self, env, expected) -> None:
        self.published.append(env)


async def test_the_controller_provisions_stops_idle_and_declares_lost_pods(fake, tmp_path, monkeypatch, issuer):
    from levers9.pool_controller import service as svc

    pools_file = tmp_path / "pools.toml"
    pools_file.write_text('[pools.gpu]\nbackend = "kubernetes"\ngpu_type = "H100"\ngpus_per_worker = 1\n'
                          'worker_secret = "levers9-pool-gpu"\nmin_warm = 0\nidle_timeout_s = 0\n')
    b = KubernetesBackend(SETTINGS, str(issuer.dir), _api(fake.url), watch_timeout_s=1)
    monkeypatch.setattr(svc, "make_backend", lambda *a: b)
    controller = svc.PoolControllerService(Settings().with_(pools_file=str(pools_file), home=str(tmp_path)))
    controller.pool, controller.bus = FakeDB(), FakeBus()  # type: ignore[assignment]
    await controller.on_start()
    pool = controller.pools["gpu"]
    try:
        await controller.provision(pool)
        await controller.provision(pool)
        first, second = sorted(controller.started_here)
        assert set(fake.objects("pods", NS)) == {M.object_name(first), M.object_name(second)}
        row = dict(status="ready", backend="kubernetes", cpu_used=0, memory_used=0, pool="gpu", last_seq=1, at=0.0)
        controller.pool.rows = [dict(row, worker_id=first)]  # the second is still provisioning elsewhere
        await controller.reconcile(pool)  # idle for 0 s >= idle_timeout_s 0, min_warm 0: stopped
        assert set(fake.objects("pods", NS)) == {M.object_name(second)}
        fake.set_phase(NS, M.object_name(second), "Failed", exit_code=1, reason="Error")
        controller.pool.rows = [dict(row, worker_id=second, status="registered")]
        deadline = time.monotonic() + 5
        lost: list = []
        while not lost and time.monotonic() < deadline:
            await controller.declare_lost()
            lost = [json.loads(bytes(e.data)) for e in controller.bus.published if e.type == "WorkerLost"]
            await asyncio.sleep(0.05)
        assert [e["worker_id"] for e in lost] == [second]
    finally:
        b.close()
