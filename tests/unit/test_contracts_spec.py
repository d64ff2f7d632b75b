"""The typed deployment spec: `decode_spec` takes the plain JSON the SDK sends and gives back the
Struct, and refuses a bad value with a sentence that names the field."""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec
import pytest
from contracts_strategies import gpu_lists, gpu_types, specs
from hypothesis import given
from hypothesis import strategies as st

from levers9 import App
from levers9.contracts import spec as S
from levers9.contracts.spec import (
    Code,
    DeploymentSpec,
    ImageSpec,
    InvalidSpec,
    Resources,
    Scaling,
    decode_spec,
    encode_spec,
    spec_from_builtins,
)

# what the SDK sends for `@app.endpoint(cpu=0.5, memory="512Mi", gpu=["L4", "T4"], ...)`: plain JSON,
# only the options that were passed, in the spec's units
SDK_SPEC = {
    "name": "say-hello", "app_name": "demo",
    "code": {"kind": "endpoint", "module": "demo_app", "handler": "say_hello", "on_start": "load"},
    "image": {"python_packages": ["numpy==2.1.0"], "apt_packages": ["curl"], "commands": ["echo hi"],
              "env": {"STAGE": "prod"}},
    "resources": {"cpu_millicores": 500, "memory_mib": 512, "gpu": ["L4", "T4"], "gpu_count": 1},
    "scaling": {"keep_warm_seconds": 30, "min_containers": 1, "max_containers": 4, "concurrency": 8},
    "timeout_seconds": 60, "secrets": ["API_KEY"], "env": {"MODE": "fast"}, "checkpoint_enabled": True,
    "pool": "gpu-pool",
}


def test_the_sdks_json_decodes_to_the_values_it_names():
    spec = decode_spec(json.dumps(SDK_SPEC))
    assert spec == DeploymentSpec(
        name="say-hello", app_name="demo",
        code=Code(kind="endpoint", module="demo_app", handler="say_hello", on_start="load"),
        image=ImageSpec(python_packages=["numpy==2.1.0"], apt_packages=["curl"], commands=["echo hi"],
                        env={"STAGE": "prod"}),
        resources=Resources(cpu_millicores=500, memory_mib=512, gpu=["L4", "T4"], gpu_count=1),
        scaling=Scaling(keep_warm_seconds=30, min_containers=1, max_containers=4, concurrency=8),
        timeout_seconds=60, secrets=["API_KEY"], env={"MODE": "fast"}, checkpoint_enabled=True, pool="gpu-pool")


def test_a_minimal_spec_takes_the_structs_defaults():
    spec = decode_spec(b'{"name": "hello", "code": {"module": "app", "handler": "hello"}}')
    assert spec.resources == Resources() and spec.scaling == Scaling() and spec.image is None
    assert (spec.resources.cpu_millicores, spec.resources.memory_mib, spec.timeout_seconds) == (1000, 1024, 180)
    assert spec.code.kind == "endpoint" and spec.pool == "default" and not spec.checkpoint_enabled


def handler(x: int = 1) -> int:
    return x


def load() -> None:
    return None


def test_what_the_sdk_emits_decodes():
    app = App("sdk-app")
    app.endpoint(name="ep", cpu=0.25, memory="1Gi", keep_warm_seconds=5, max_containers=3, on_start=load,
                 checkpoint_enabled=True, env={"A": "1"})(handler)
    [emitted] = app.specs()
    spec = decode_spec(json.dumps(emitted))
    assert (spec.name, spec.app_name, spec.code.handler, spec.code.on_start) == ("ep", "sdk-app", "handler", "load")
    assert (spec.resources.cpu_millicores, spec.resources.memory_mib) == (250, 1024)
    assert (spec.scaling.keep_warm_seconds, spec.scaling.max_containers) == (5, 3)
    assert spec.checkpoint_enabled and spec.env == {"A": "1"}


@given(spec=specs)
def test_every_valid_spec_survives_the_wire_and_the_projection(spec):
    assert decode_spec(encode_spec(spec)) == spec
    assert decode_spec(json.dumps(msgspec.to_builtins(spec))) == spec  # plain JSON, as the SDK writes it
    assert spec_from_builtins(json.loads(encode_spec(spec))) == spec  # the projection's jsonb column


def with_value(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SDK_SPEC)
    *parents, last = path.split(".")
    target = doc
    for key in parents:
        target = target[key]
    target[last] = value
    return doc


@pytest.mark.parametrize("path,value,named", [
    ("resources.cpu_millicores", -1, "$.resources.cpu_millicores"),
    ("resources.cpu_millicores", 0, "$.resources.cpu_millicores"),
    ("resources.cpu_millicores", S.MAX_CPU_MILLICORES + 1, "$.resources.cpu_millicores"),
    ("resources.cpu_millicores", 0.5, "$.resources.cpu_millicores"),  # cores are not millicores
    ("resources.memory_mib", 15, "$.resources.memory_mib"),
    ("resources.memory_mib", "512Mi", "$.resources.memory_mib"),
    ("resources.gpu_count", S.MAX_GPUS + 1, "$.resources.gpu_count"),
    ("resources.gpu", ["a b"], "$.resources.gpu[0]"),
    ("resources.gpu", "T4", "$.resources.gpu"),
    ("scaling.max_containers", 0, "$.scaling.max_containers"),
    ("scaling.min_containers", 5, "max_containers=4 is below min_containers=5"),
    ("scaling.concurrency", 0, "$.scaling.concurrency"),
    ("scaling.keep_warm_seconds", -1, "$.scaling.keep_warm_seconds"),
    ("name", "Say_Hello", "$.name"),
    ("name", "a.b", "$.name"),
    ("name", "", "$.name"),
    ("code.kind", "task", "$.code.kind"),
    ("code.module", "my-app", "$.code.module"),
    ("code.handler", "1st", "$.code.handler"),
    ("code.on_start", "load()", "$.code.on_start"),
    ("timeout_seconds", 0, "$.timeout_seconds"),
    ("secrets", ["BAD-NAME"], "$.secrets[0]"),
    ("env", {"1X": "v"}, "$.env"),
    ("pool", "a b", "$.pool"),
    ("checkpoint_enabled", "yes", "$.checkpoint_enabled"),
    ("image.base_image", "Not A Reference", "$.image.base_image"),
    ("image.python_packages", ["-r requirements.txt"], "$.image.python_packages[0]"),
    ("image.apt_packages", ["Bad Name"], "$.image.apt_packages[0]"),
])
def test_a_bad_value_is_refused_with_a_sentence_naming_the_field(path, value, named):
    with pytest.raises(InvalidSpec) as info:
        decode_spec(json.dumps(with_value(path, value)))
    message = str(info.value)
    assert message.startswith("the deployment spec is not valid: ")
    assert named in message


def test_a_spec_that_is_not_json_or_lacks_its_code_is_refused():
    with pytest.raises(InvalidSpec, match="not JSON"):
        decode_spec(b'{"name": ')
    with pytest.raises(InvalidSpec, match="missing required field `code`"):
        decode_spec(b'{"name": "hello"}')
    with pytest.raises(InvalidSpec, match="missing required field `handler`"):
        decode_spec(b'{"name": "hello", "code": {"module": "app"}}')


@given(cpu=st.integers(max_value=0))
def test_no_cpu_at_or_below_zero(cpu):
    with pytest.raises(InvalidSpec, match=r"cpu_millicores"):
        decode_spec(json.dumps(with_value("resources.cpu_millicores", cpu)))


@given(memory=st.integers(max_value=S.MIN_MEMORY_MIB - 1))
def test_no_memory_below_the_minimum(memory):
    with pytest.raises(InvalidSpec, match=r"memory_mib"):
        decode_spec(json.dumps(with_value("resources.memory_mib", memory)))


@given(low=st.integers(1, 100), data=st.data())
def test_max_containers_below_min_containers_is_refused(low, data):
    high = data.draw(st.integers(1, low - 1)) if low > 1 else None
    doc = with_value("scaling.min_containers", low)
    if high is None:
        doc["scaling"]["max_containers"] = low  # equal is fine
        assert decode_spec(json.dumps(doc)).scaling.min_containers == low
        return
    doc["scaling"]["max_containers"] = high
    with pytest.raises(InvalidSpec, match=f"max_containers={high} is below min_containers={low}"):
        decode_spec(json.dumps(doc))


@given(gpu=gpu_lists, count=st.integers(0, S.MAX_GPUS))
def test_naming_a_gpu_type_takes_at_least_one(gpu, count):
    res = Resources(gpu=gpu, gpu_count=count)
    assert res.gpus == (max(1, count) if gpu else count)
    assert res.gpus >= count


@given(gpu=gpu_types)
def test_a_gpu_type_alone_is_one_gpu(gpu):
    assert Resources(gpu=[gpu]).gpus == 1


def test_a_row_projected_before_the_typed_spec_still_reads_as_a_spec():
    from levers9.contracts.spec import spec_from_builtins

    legacy = {"deployment_id": "hello-v3", "name": "hello", "version": 3, "kind": "endpoint", "module": "hello",
              "handler": "hello", "on_start": "load", "cpu_millicores": 500, "memory_mib": 256, "gpu": [],
              "gpu_count": 0, "image": "", "keep_warm_seconds": 30, "min_containers": 0, "max_containers": 2,
              "concurrency": 4, "timeout_seconds": 60, "checkpoint_enabled": True, "pool": "default",
              "env": {"A": "1"}, "secrets": ["KEY"], "code_sha256": "ab" * 32, "code_key": "code/x.tar.gz",
              "app_name": "hello"}
    spec = spec_from_builtins(legacy)
    assert (spec.name, spec.code.module, spec.code.handler, spec.code.on_start) == ("hello", "hello", "hello", "load")
    assert (spec.code.sha256, spec.code.key) == ("ab" * 32, "code/x.tar.gz")
    assert (spec.resources.cpu_millicores, spec.resources.memory_mib) == (500, 256)
    assert (spec.scaling.keep_warm_seconds, spec.scaling.max_containers, spec.scaling.concurrency) == (30, 2, 4)
    assert spec.checkpoint_enabled and spec.env == {"A": "1"} and spec.secrets == ["KEY"] and spec.image is None
    assert legacy["cpu_millicores"] == 500  # the row it was given is left as it was
