"""The SDK's spec against the typed one: every spec the SDK emits for valid options decodes with
`decode_spec` to the values the options asked for, the SDK's units are the Struct's, and the few
defaults the SDK keeps are the Struct's (so they cannot drift)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9 import App, Image, Secret, options
from levers9.app import SPEC_KEYS
from levers9.contracts import spec as S
from levers9.contracts.spec import Code, DeploymentSpec, ImageSpec, InvalidSpec, Resources, Scaling, decode_spec

GPU_TYPES = ["T4", "L4", "A10G", "A100", "A100-80", "H100", "L40S"]


def load():
    return 1


def handler(x: int = 1):
    return x


def emit(**opts: Any) -> dict[str, Any]:
    app = App("prop-app")
    app.endpoint(name="ep", **opts)(handler)
    [spec] = app.specs()
    return spec


def decoded(spec: dict[str, Any]) -> DeploymentSpec:
    return decode_spec(json.dumps(spec))


def assert_within(emitted: Any, full: Any, where: str = "$") -> None:
    """Every key the SDK emitted is in the decoded spec with the same value (a misspelt key, which
    msgspec would drop silently, fails here)."""
    if isinstance(emitted, dict):
        assert isinstance(full, dict), where
        for key, value in emitted.items():
            assert key in full, f"{where}.{key} is not a field of DeploymentSpec"
            assert_within(value, full[key], f"{where}.{key}")
    else:
        assert emitted == full, where


# ---- the defaults the SDK keeps are the Struct's -----------------------------------------------------

def test_the_sdk_defaults_are_the_structs():
    assert options.DEFAULT_MIN_CONTAINERS == Scaling().min_containers
    assert options.DEFAULT_MAX_CONTAINERS == Scaling().max_containers
    assert options.MIN_MEMORY_MIB == S.MIN_MEMORY_MIB
    assert Image().to_dict() == {} and msgspec.convert(Image().to_dict(), ImageSpec) == ImageSpec()
    assert SPEC_KEYS == DeploymentSpec.__struct_fields__


def test_a_spec_without_options_decodes_to_the_struct_defaults():
    spec = emit()
    assert decoded(spec) == DeploymentSpec(name="ep", app_name="prop-app",
                                           code=Code(kind="endpoint", module=__name__, handler="handler"))
    assert "resources" not in spec and "scaling" not in spec  # nothing the Struct does not decide itself


# ---- every valid spec decodes to what the options asked for -------------------------------------------

names = st.from_regex(r"\A[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?\Z")
env_names = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,20}\Z").filter(lambda n: not n.upper().startswith("LEVERS9_"))
cpus = st.one_of(
    st.integers(min_value=1, max_value=256),
    st.floats(min_value=0.001, max_value=256, allow_nan=False),
    st.integers(min_value=1, max_value=S.MAX_CPU_MILLICORES).map(lambda m: f"{m}m"),
    st.decimals(min_value="0.001", max_value="256", places=3).map(str),
)
memories = st.one_of(
    st.integers(min_value=S.MIN_MEMORY_MIB, max_value=S.MAX_MEMORY_MIB),
    st.integers(min_value=S.MIN_MEMORY_MIB, max_value=S.MAX_MEMORY_MIB).map(lambda m: f"{m}Mi"),
    st.integers(min_value=1, max_value=S.MAX_MEMORY_MIB // 1024).map(lambda g: f"{g}Gi"),
    st.integers(min_value=1, max_value=S.MAX_MEMORY_MIB // 1024).map(lambda g: f"{g}G"),
    st.sampled_from(["1Ti", "4Ti", "1.5Gi", "0.5Gi"]),
)
packages = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.=<>~\[\]-]{0,30}\Z")
texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=20).filter(str.strip)


@st.composite
def valid_options(draw: st.DrawFn) -> dict[str, Any]:
    opts: dict[str, Any] = {}

    def maybe(key: str, strategy: st.SearchStrategy) -> None:
        if draw(st.booleans()):
            opts[key] = draw(strategy)

    maybe("cpu", cpus)
    maybe("memory", memories)
    maybe("gpu", st.one_of(st.sampled_from(GPU_TYPES), st.lists(st.sampled_from(GPU_TYPES), min_size=1)))
    maybe("gpu_count", st.integers(min_value=1 if opts.get("gpu") else 0, max_value=S.MAX_GPUS))
    maybe("image", st.builds(Image, python_packages=st.lists(packages, max_size=3),
                             commands=st.lists(texts.filter(lambda c: "\x00" not in c), max_size=3),
                             base_image=st.sampled_from([None, "python:3.12-slim", "localhost:5000/team/base:1"])))
    maybe("keep_warm_seconds", st.integers(min_value=0, max_value=86_400))
    maybe("min_containers", st.integers(min_value=0, max_value=100))
    low = max(1, opts.get("min_containers", options.DEFAULT_MIN_CONTAINERS))
    if low > options.DEFAULT_MAX_CONTAINERS or draw(st.booleans()):
        opts["max_containers"] = draw(st.integers(min_value=low, max_value=1000))
    maybe("concurrency", st.integers(min_value=1, max_value=10_000))
    maybe("timeout", st.integers(min_value=1, max_value=86_400))
    maybe("secrets", st.lists(st.one_of(env_names, env_names.map(Secret)), max_size=4))
    maybe("env", st.dictionaries(env_names, st.text(max_size=20), max_size=4))
    maybe("on_start", st.just(load))
    maybe("checkpoint_enabled", st.booleans())
    maybe("pool", names)
    return opts


def expected_millicores(cpu: Any) -> int:
    if isinstance(cpu, str):
        return int(cpu[:-1]) if cpu.endswith("m") else round(float(cpu) * 1000)
    return round(cpu * 1000)


def expected_mib(memory: Any) -> int:
    if isinstance(memory, int):
        return memory
    number, unit = re.fullmatch(r"([\d.]+)(\w*)", memory).groups()
    return math.ceil(float(number) * {"": 1, "Mi": 1, "Gi": 1024, "G": 1024, "Ti": 1024 * 1024}[unit])


@given(valid_options())
def test_every_spec_the_sdk_emits_decodes_to_the_same_values(opts):
    spec = emit(**opts)
    got = decoded(spec)
    assert_within(spec, msgspec.to_builtins(got))
    assert set(spec) <= set(SPEC_KEYS)

    default_res, default_scaling, default = Resources(), Scaling(), DeploymentSpec(name="x", code=got.code)
    res, scaling = got.resources, got.scaling
    assert res.cpu_millicores == (expected_millicores(opts["cpu"]) if "cpu" in opts else default_res.cpu_millicores)
    assert res.memory_mib == (expected_mib(opts["memory"]) if "memory" in opts else default_res.memory_mib)
    gpus = [opts["gpu"]] if isinstance(opts.get("gpu"), str) else list(dict.fromkeys(opts.get("gpu", [])))
    assert res.gpu == gpus
    assert res.gpu_count == opts.get("gpu_count", 1 if gpus else 0)
    assert got.image == (ImageSpec(**opts["image"].to_dict()) if "image" in opts else None)
    for option in ("keep_warm_seconds", "min_containers", "max_containers", "concurrency"):
        assert getattr(scaling, option) == opts.get(option, getattr(default_scaling, option)), option
    assert got.timeout_seconds == opts.get("timeout", default.timeout_seconds)
    secrets = [s.name if isinstance(s, Secret) else s for s in opts.get("secrets", [])]
    assert got.secrets == list(dict.fromkeys(secrets))
    assert got.env == opts.get("env", {})
    assert got.code == Code(kind="endpoint", module=__name__, handler="handler",
                            on_start="load" if "on_start" in opts else "")
    assert got.checkpoint_enabled == opts.get("checkpoint_enabled", default.checkpoint_enabled)
    assert got.pool == opts.get("pool", default.pool)
    assert (got.name, got.app_name) == ("ep", "prop-app")


# ---- units: the SDK's parsing agrees with the Struct's ------------------------------------------------

@given(st.integers(min_value=1, max_value=S.MAX_CPU_MILLICORES // 1000))
def test_cpu_is_given_in_cores_and_sent_in_millicores(cores):
    assert decoded(emit(cpu=cores)).resources.cpu_millicores == cores * 1000
    assert decoded(emit(cpu=f"{cores * 1000}m")).resources.cpu_millicores == cores * 1000


@given(st.integers(min_value=1, max_value=S.MAX_MEMORY_MIB // 1024))
def test_memory_is_sent_in_mib(gib):
    assert decoded(emit(memory=f"{gib}Gi")).resources.memory_mib == gib * 1024
    assert decoded(emit(memory=gib * 1024)).resources.memory_mib == gib * 1024


def struct_accepts(**resources: Any) -> bool:
    try:
        decode_spec(json.dumps({"name": "x", "code": {"module": "m", "handler": "h"}, "resources": resources}))
    except InvalidSpec:
        return False
    return True


def sdk_accepts(parse: Any, value: Any) -> bool:
    try:
        parse(value)
    except options.ConfigError:
        return False
    return True


@given(st.integers(min_value=-5, max_value=S.MIN_MEMORY_MIB + 5))
def test_the_smallest_memory_is_the_same_on_both_sides(mib):
    assert sdk_accepts(options.parse_memory, mib) == struct_accepts(memory_mib=mib)


@given(st.integers(min_value=-5, max_value=5))
def test_the_smallest_cpu_is_the_same_on_both_sides(millicores):
    assert sdk_accepts(options.parse_cpu, f"{millicores}m") == struct_accepts(cpu_millicores=millicores)


# ---- names the SDK accepts, the Struct accepts -----------------------------------------------------

@given(st.from_regex(options.APP_NAME_RE, fullmatch=True))
def test_endpoint_and_pool_names(name):
    assert re.fullmatch(S.Name.__metadata__[0].pattern, name)
    assert re.fullmatch(S.PoolName.__metadata__[0].pattern, name)


@given(st.from_regex(options.GPU_NAME_RE, fullmatch=True))
def test_gpu_type_names(name):
    assert re.fullmatch(S.GpuType.__metadata__[0].pattern, name)


@given(st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,127}\Z"))
def test_env_and_secret_names(name):
    assert options.ENV_NAME_RE.match(name)
    assert re.fullmatch(S.EnvName.__metadata__[0].pattern, name)


@pytest.mark.parametrize("opts", [{"min_containers": 3}, {"min_containers": 2, "max_containers": 1}])
def test_min_above_max_is_refused_by_both(opts):
    with pytest.raises(options.ConfigError, match="raise max_containers to at least"):
        emit(**opts)
    scaling = {"min_containers": opts["min_containers"], **({"max_containers": 1} if "max_containers" in opts else {})}
    with pytest.raises(InvalidSpec, match="below min_containers"):
        decode_spec(json.dumps({"name": "x", "code": {"module": "m", "handler": "h"}, "scaling": scaling}))
