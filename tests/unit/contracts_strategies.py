"""Hypothesis strategies for the contracts: valid specs and their parts, checkpoint refs, and every
event with valid values (the typed fields built from these strategies, the rest from plain ones)."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st

from levers9.contracts import EVENT_TYPES
from levers9.contracts import spec as S
from levers9.contracts.images import BuildStep, build_steps
from levers9.contracts.spec import ArchiveRef, CheckpointRef, Code, DeploymentSpec, ImageSpec, Resources, Scaling

ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,40}\Z")
workspaces = st.from_regex(r"\A[a-z0-9][a-z0-9-]{0,20}\Z")
text = st.text(max_size=30)
names = st.from_regex(r"\A[a-z0-9][a-z0-9-]{0,30}\Z")
pool_names = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,20}\Z")
identifiers = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,20}\Z")
env_names = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,20}\Z")
gpu_types = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,10}\Z")
sha256s = st.from_regex(r"\A[0-9a-f]{64}\Z")
nonempty = st.text(min_size=1, max_size=20)

cpu_millicores = st.integers(1, S.MAX_CPU_MILLICORES)
memory_mib = st.integers(S.MIN_MEMORY_MIB, S.MAX_MEMORY_MIB)
gpu_lists = st.lists(gpu_types, max_size=3)
gpu_counts = st.integers(0, S.MAX_GPUS)

resources = st.builds(Resources, cpu_millicores=cpu_millicores, memory_mib=memory_mib, gpu=gpu_lists,
                      gpu_count=gpu_counts)


@st.composite
def scalings(draw: st.DrawFn) -> Scaling:
    low = draw(st.integers(0, 100))
    return Scaling(keep_warm_seconds=draw(st.integers(0, 86_400)), min_containers=low,
                   max_containers=draw(st.integers(max(1, low), 1000)), concurrency=draw(st.integers(1, 10_000)))


codes = st.builds(Code, kind=st.sampled_from(["endpoint", "asgi"]), module=identifiers, handler=identifiers,
                  on_start=st.just("") | identifiers, sha256=st.just("") | sha256s, key=text)
python_packages = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.=<>~\[\]-]{0,30}\Z")
apt_packages = st.from_regex(r"\A[a-z0-9][a-z0-9+.-]{0,20}\Z")
images = st.builds(ImageSpec, base_image=st.sampled_from(["", "localhost:5000/team/base:1", "python:3.11-slim"]),
                   apt_packages=st.lists(apt_packages, max_size=3), python_packages=st.lists(python_packages, max_size=3),
                   commands=st.lists(nonempty.filter(lambda c: c.strip() and "\x00" not in c), max_size=3),
                   env=st.dictionaries(env_names, text, max_size=3))

specs = st.builds(
    DeploymentSpec, name=names, app_name=st.just("") | names, code=codes, image=st.none() | images,
    resources=resources, scaling=scalings(), timeout_seconds=st.integers(1, 86_400),
    secrets=st.lists(env_names, max_size=3), env=st.dictionaries(env_names, text, max_size=3),
    checkpoint_enabled=st.booleans(), pool=pool_names)

checkpoint_refs = st.builds(CheckpointRef, checkpoint_id=ids, accelerator=st.just("") | gpu_types,
                            sha256=st.just("") | sha256s, size_bytes=st.integers(0, 1 << 40), bucket=text, key=text,
                            location=text)


archive_refs = st.builds(ArchiveRef, bucket=text, key=text, sha256=sha256s, size_bytes=st.integers(0, 1 << 40),
                         index_key=text, index_sha256=sha256s, index_size=st.integers(0, 1 << 30),
                         chunk_size=st.integers(1, 1 << 26), files=st.integers(0, 1 << 20))
build_steps_lists = images.map(build_steps)


def field_strategy(name: str, annotation: object) -> st.SearchStrategy[Any]:
    """Valid values for one field of an event."""
    typed = {Resources: resources, DeploymentSpec: specs, DeploymentSpec | None: st.none() | specs,
             CheckpointRef | None: st.none() | checkpoint_refs, ImageSpec: images,
             list[BuildStep]: build_steps_lists, ArchiveRef | None: st.none() | archive_refs,
             float: st.floats(0, 1e6, allow_nan=False)}
    if name == "state":
        return st.sampled_from(["cached", "running", "log", "done", "failed", "pushing"])
    for kind, strategy in typed.items():
        if annotation == kind:
            return strategy
    if name.endswith("_id"):
        return ids
    if annotation is int:
        return st.integers(min_value=-(2**31), max_value=2**31)
    if annotation == (int | None):
        return st.none() | st.integers(min_value=-255, max_value=255)
    if annotation is bool:
        return st.booleans()
    if annotation == list[str]:
        return st.lists(text, max_size=4)
    if annotation == dict[str, str]:
        return st.dictionaries(text, text, max_size=3)
    if annotation == dict[str, Any]:  # JSON values
        return st.dictionaries(text, st.one_of(text, st.integers(-1000, 1000), st.lists(text, max_size=2)),
                               max_size=3)
    if annotation is str:
        return text
    raise TypeError(f"no strategy for {name}: {annotation!r}; add one here")


@st.composite
def any_event(draw: st.DrawFn) -> Any:
    cls = draw(st.sampled_from(sorted(EVENT_TYPES.values(), key=lambda c: c.__name__)))
    values = {f.name: draw(ids if f.name == cls.ID_FIELD else field_strategy(f.name, f.type))
              for f in msgspec.structs.fields(cls)}
    return cls(**values)
