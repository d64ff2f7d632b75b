"""The gateway's decisions as pure functions: paths, specs, bodies, auth, route status, container requests."""

from __future__ import annotations

import io
import json
import tarfile

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts import events as E
from levers9.contracts.checkpoint_policy import restore_choice
from levers9.contracts.spec import MAX_GPUS, CheckpointRef, InvalidSpec, Resources, decode_spec
from levers9.gateway.auth import Caller, admin_refusal, bearer_secret, user_refusal, worker_of
from levers9.gateway.code_archive import archive_problem
from levers9.gateway.routes_containers import BUILD_POOL_REFUSED, InvalidRequest, RefusedPool, parse_container_request
from levers9.gateway.routes_deployments import NotJSON, parse_spec, with_code
from levers9.gateway.routes_invoke import LATEST, container_requested, split_version
from levers9.gateway.routes_workers import worker_action_event
from levers9.gateway.state import Deployment, route_update, row_json
from levers9.runtime.views import CONTAINER_STATUS

SPEC = {"name": "hello", "code": {"module": "app", "handler": "hello"}}
segment = st.text(alphabet="abcv0123456789-_.", min_size=0, max_size=8)


def tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def deployment(spec: dict | None = None, version: int = 3) -> Deployment:
    s = decode_spec(json.dumps({**SPEC, **(spec or {})}))
    return Deployment("acme", f"{s.name}-v{version}", s.name, version, "active", s)


# ---- paths: which version a call names ------------------------------------------------------------

@given(version=st.integers(0, 10**6), tail=st.lists(segment, max_size=3).map("/".join))
def test_a_version_segment_names_that_version_and_is_not_passed_on(version, tail):
    target = split_version(f"v{version}/{tail}")
    assert (target.which, target.version, target.rest) == (f"v{version}", version, tail)


@given(tail=st.lists(segment, max_size=3).map("/".join))
def test_latest_names_the_newest_and_is_not_passed_on(tail):
    target = split_version(f"latest/{tail}")
    assert (target.which, target.version, target.rest) == (LATEST, None, tail)


@given(rest=st.lists(segment, max_size=4).map("/".join))
def test_any_other_path_goes_to_the_newest_untouched(rest):
    head = rest.partition("/")[0]
    target = split_version(rest)
    if head == LATEST or (head.startswith("v") and head[1:].isdigit() and head[1:].isascii()):
        assert target.rest == rest.partition("/")[2]
    else:
        assert (target.which, target.version, target.rest) == (LATEST, None, rest)


def test_version_paths_by_example():
    assert split_version("") == split_version("latest")
    assert split_version("v2").rest == "" and split_version("v2").version == 2
    assert split_version("vx/a").rest == "vx/a" and split_version("version/a").version is None


# ---- the deploy form's spec --------------------------------------------------------------------

def test_a_bad_name_gets_the_sentence_that_says_how_to_fix_it():
    with pytest.raises(InvalidSpec, match="endpoint name 'Say_Hello' is not valid: use lowercase letters"):
        parse_spec(json.dumps({**SPEC, "name": "Say_Hello"}))


@pytest.mark.parametrize("text, words", [
    ("{not json", "not JSON"),
    (json.dumps({"name": "x"}), "code"),
    (json.dumps({**SPEC, "resources": {"cpu_millicores": 0}}), "cpu_millicores"),
    (json.dumps({**SPEC, "code": {"module": "app", "handler": "h", "kind": "grpc"}}), "kind"),
    (json.dumps({**SPEC, "name": 7}), "name"),
])
def test_other_spec_errors_are_decode_specs_sentences(text, words):
    with pytest.raises(InvalidSpec, match="the deployment spec is not") as e:
        parse_spec(text)
    assert words in str(e.value)


def test_a_good_spec_decodes_and_gets_its_code_archive():
    spec = with_code(parse_spec(json.dumps(SPEC)), "ab" * 32, "code/x.tar.gz")
    assert spec.code.sha256 == "ab" * 32 and spec.code.key == "code/x.tar.gz"
    assert (spec.code.module, spec.code.handler) == ("app", "hello")
    assert spec.resources == Resources()  # the Struct's defaults, written once


def test_an_archive_must_be_a_tar_gz_holding_the_module():
    assert archive_problem(tar_gz({"app.py": b"x = 1\n"}), "app") == (0, "")
    assert archive_problem(tar_gz({"./app.py": b""}), "app") == (0, "")
    assert archive_problem(tar_gz({"other.py": b""}), "app") == (422, "the code archive has no app.py (it has: other.py)")
    status, problem = archive_problem(b"plain bytes", "app")
    assert status == 422 and "is not a tar.gz" in problem


@pytest.mark.parametrize("text", ["[" * 10_000 + "]" * 10_000, '{"name": ', "\udcff"])
def test_a_spec_that_is_not_json_is_refused_before_any_decoder(text):
    with pytest.raises(NotJSON, match="the deployment spec"):
        parse_spec(text)


def test_a_container_request_refuses_the_build_pool_and_says_why():
    with pytest.raises(RefusedPool) as e:
        parse_container_request(json.dumps({"pool": "build"}).encode())
    assert str(e.value) == BUILD_POOL_REFUSED and "image builders" in BUILD_POOL_REFUSED


# ---- the bare container request ----------------------------------------------------------------

@given(cpu=st.integers(1, 256_000), memory=st.integers(16, 4 * 1024 * 1024), count=st.integers(0, MAX_GPUS))
def test_a_container_request_takes_millicores_and_mib(cpu, memory, count):
    asked = parse_container_request(json.dumps({"cpu_millicores": cpu, "memory_mib": memory, "gpu_count": count,
                                                "pool": "gpu-pool"}).encode())
    assert asked.resources == Resources(cpu_millicores=cpu, memory_mib=memory, gpu_count=count)
    assert asked.where == {"pool": "gpu-pool"}


@pytest.mark.parametrize("body, words", [
    ({"cpu": 0.5, "memory": 128}, "unknown field 'cpu'"),
    ({"cpu_millicores": -1}, "cpu_millicores"),
    ({"cpu_millicores": 0.5}, "cpu_millicores"),
    ({"memory_mib": 8}, "memory_mib"),
    ({"pool": "a.b"}, "pool 'a.b' is not valid"),
    ({"deployment_id": "x>"}, "deployment_id 'x>' is not valid"),
    ({"deployment_id": None}, "deployment_id None is not valid"),
    ([1, 2], "a JSON object"),
])
def test_a_bad_container_request_says_which_field(body, words):
    with pytest.raises(InvalidRequest, match=words.replace(".", r"\.")):
        parse_container_request(json.dumps(body).encode())


def test_an_empty_container_request_takes_the_defaults():
    assert parse_container_request(b"") == parse_container_request(b"{}")
    assert parse_container_request(b"").resources == Resources() and parse_container_request(b"").where == {}
    with pytest.raises(InvalidRequest, match="not JSON"):
        parse_container_request(b"{")


# ---- auth --------------------------------------------------------------------------------------

@given(secret=st.text(alphabet="abcXYZ019_-", min_size=1, max_size=40))
def test_a_bearer_header_yields_its_secret(secret):
    assert bearer_secret(f"Bearer {secret}") == secret
    assert bearer_secret(f"bearer  {secret} ") == secret
    assert bearer_secret(f"Basic {secret}") == ""
    assert bearer_secret(secret) == ""


def test_who_may_call_what():
    user = Caller(workspace="acme", token_id="t")
    admin = Caller(workspace="default", token_id="t")
    worker = Caller(workspace="default", token_id="t", scope="worker:w1")
    assert user_refusal(user) == "" and user_refusal(admin) == ""
    assert user_refusal(worker) == "a worker token cannot call the user API"
    assert admin_refusal(admin) == ""
    assert "use a token of workspace 'default'" in admin_refusal(user)
    assert admin_refusal(worker) == "a worker token cannot call the user API"
    assert worker_of(worker) == "w1" and worker_of(user) == "" and worker_of(admin) == ""


# ---- container events drive the router ---------------------------------------------------------

def event(name: str, **given) -> E.Event:
    """An event of this type with its required fields filled ("x", 0) and `given` on top."""
    cls = E.EVENT_TYPES[name]
    filled = {f.name: ("x" if f.type is str else 0) for f in msgspec.structs.fields(cls) if f.required}
    return cls(**{**filled, **given})


def test_every_status_event_routes_with_its_address_and_reason():
    ready = route_update(event("ContainerReady", container_id="c", address="http://a:1"))
    assert (ready.status, ready.address) == ("ready", "http://a:1")
    failed = route_update(event("ContainerFailed", container_id="c", reason="oom"))
    assert (failed.status, failed.reason) == ("failed", "oom")
    assert route_update(event("ContainerCheckpointRequested", container_id="c")) is None
    for name, status in CONTAINER_STATUS.items():
        assert route_update(event(name, container_id="c")).status == status


# ---- the container a waiting call asks for -----------------------------------------------------

def test_a_requested_container_carries_the_spec_and_the_policys_checkpoint():
    dep = deployment({"checkpoint_enabled": True, "resources": {"cpu_millicores": 250, "memory_mib": 128},
                      "pool": "p1"})
    ref = CheckpointRef(checkpoint_id="ck1", accelerator="", sha256="s", size_bytes=9, bucket="b", key="k",
                        location="http://n")
    restoring = container_requested(dep, restore_choice(dep.spec, [ref]), "c1")
    assert restoring.checkpoint == ref and restoring.note == "" and restoring.checkpoint_id == "ck1"
    assert (restoring.resources.cpu_millicores, restoring.resources.memory_mib, restoring.pool) == (250, 128, "p1")
    assert restoring.spec == dep.spec and restoring.deployment_version == 3 and restoring.deployment_id == "hello-v3"
    cold = container_requested(dep, restore_choice(dep.spec, []), "c2")
    assert cold.checkpoint is None and cold.note.startswith("cold: no checkpoint")
    off = deployment()
    assert container_requested(off, restore_choice(off.spec, [ref]), "c3").checkpoint is None
    # it survives the wire as the scheduler reads it
    assert msgspec.json.decode(msgspec.json.encode(restoring), type=E.ContainerRequested) == restoring


def test_a_deployment_row_decodes_its_spec():
    spec = decode_spec(json.dumps(SPEC))
    row = {"workspace": "acme", "deployment_id": "hello-v1", "name": "hello", "version": 1, "status": "active",
           "spec": msgspec.json.encode(spec).decode()}
    assert Deployment.from_row(row).spec == spec
    out = row_json(row, "spec")
    assert out["spec"]["code"]["module"] == "app" and out["spec"]["resources"]["cpu_millicores"] == 1000


def test_worker_actions():
    assert worker_action_event("w", "cordon") == E.WorkerCordoned(worker_id="w")
    assert worker_action_event("w", "drain") == E.WorkerCordoned(worker_id="w", drain=True)
    assert worker_action_event("w", "uncordon") == E.WorkerUncordoned(worker_id="w")
    assert worker_action_event("w", "reboot") is None
