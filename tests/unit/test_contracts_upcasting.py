"""Every upcaster: an old body built from random valid values decodes (through the envelope, the way
consumers read the log) to a current event with the same values."""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec
import pytest
from contracts_strategies import (
    checkpoint_refs,
    cpu_millicores,
    gpu_counts,
    gpu_lists,
    gpu_types,
    ids,
    memory_mib,
    pool_names,
    specs,
    text,
)
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts import EVENT_TYPES, ContractError, decode, uuid7
from levers9.contracts import events as E
from levers9.contracts.spec import CheckpointRef, Code, DeploymentSpec, ImageSpec, Resources
from levers9.contracts.upcasting import UPCASTERS, upcast


def old_message(event_type: str, version: int, body: dict[str, Any], workspace: str = "acme") -> bytes:
    return json.dumps({"id": uuid7(), "type": event_type, "version": version, "occurred_at": "2026-01-01T00:00:00Z",
                       "workspace": workspace, "correlation_id": "c", "data": body}).encode()


def test_every_old_version_has_an_upcaster():
    for name, cls in EVENT_TYPES.items():
        for version in range(1, cls.VERSION):
            assert (name, version) in UPCASTERS, f"{name} v{version} cannot be read"
    assert {name for name, _ in UPCASTERS} == {"DeploymentCreated", "ContainerRequested", "ContainerScheduled",
                                               "ImageBuildRequested", "ImageBuildStarted", "ImageBuilt"}


# ---- DeploymentCreated v1 -> v2 ------------------------------------------------------------------

def deployment_created_v1(deployment_id: str, version: int, spec: DeploymentSpec) -> dict[str, Any]:
    """The flat v1 body the gateway wrote for `spec` (the image as a JSON string, "" for none)."""
    res, scaling, code = spec.resources, spec.scaling, spec.code
    return {
        "deployment_id": deployment_id, "name": spec.name, "version": version, "kind": code.kind,
        "handler": code.handler, "module": code.module, "on_start": code.on_start, "code_sha256": code.sha256,
        "code_key": code.key, "image": json.dumps(msgspec.to_builtins(spec.image)) if spec.image else "",
        "cpu_millicores": res.cpu_millicores, "memory_mib": res.memory_mib, "gpu": list(res.gpu),
        "gpu_count": res.gpu_count, "keep_warm_seconds": scaling.keep_warm_seconds,
        "min_containers": scaling.min_containers, "max_containers": scaling.max_containers,
        "concurrency": scaling.concurrency, "timeout_seconds": spec.timeout_seconds,
        "checkpoint_enabled": spec.checkpoint_enabled, "pool": spec.pool, "env": dict(spec.env),
        "secrets": list(spec.secrets), "app_name": spec.app_name,
    }


@given(spec=specs, deployment_id=ids, version=st.integers(1, 10_000))
def test_deployment_created_v1_upcasts_to_v2_with_the_same_values(spec, deployment_id, version):
    body = deployment_created_v1(deployment_id, version, spec)
    event = decode(old_message("DeploymentCreated", 1, body)).event
    assert event == E.DeploymentCreated(deployment_id=deployment_id, name=spec.name, version=version, spec=spec)


def test_a_v1_deployment_with_only_its_required_fields_gets_the_specs_defaults():
    body = {"deployment_id": "hello-v1", "name": "hello", "module": "app", "handler": "hello"}
    event = decode(old_message("DeploymentCreated", 1, body)).event
    assert isinstance(event, E.DeploymentCreated)
    assert event.spec == DeploymentSpec(name="hello", code=Code(module="app", handler="hello"))
    assert event.version == 1


def test_a_v1_deployment_whose_values_the_spec_refuses_says_why():
    body = {"deployment_id": "hello-v1", "name": "hello", "module": "app", "handler": "hello", "memory_mib": 8}
    with pytest.raises(ContractError, match=r"DeploymentCreated v1 body is not valid.*memory_mib"):
        decode(old_message("DeploymentCreated", 1, body))


# ---- ContainerRequested v1 -> v3 and v2 -> v3 -------------------------------------------------------

@st.composite
def container_requested_values(draw: st.DrawFn) -> dict[str, Any]:
    """Valid values of a ContainerRequested, flat, as v1 and v2 carried them."""
    return {
        "container_id": draw(ids), "deployment_id": draw(st.just("") | ids), "image": draw(text),
        "cpu_millicores": draw(cpu_millicores), "memory_mib": draw(memory_mib), "gpu": draw(gpu_lists),
        "gpu_count": draw(gpu_counts), "pool": draw(pool_names), "checkpoint_id": draw(st.just("") | ids),
        "accelerator": draw(st.just("") | gpu_types), "reason": draw(text),
        "deployment_version": draw(st.integers(0, 10_000)), "attempt": draw(st.integers(1, 10)),
        "excluded_workers": draw(st.lists(ids, max_size=3)), "note": draw(text),
    }


def current_container_requested(values: dict[str, Any]) -> E.ContainerRequested:
    checkpoint = (CheckpointRef(checkpoint_id=values["checkpoint_id"], accelerator=values["accelerator"])
                  if values["checkpoint_id"] else None)
    return E.ContainerRequested(
        container_id=values["container_id"], deployment_id=values["deployment_id"],
        deployment_version=values["deployment_version"], pool=values["pool"], checkpoint=checkpoint,
        resources=Resources(cpu_millicores=values["cpu_millicores"], memory_mib=values["memory_mib"],
                            gpu=values["gpu"], gpu_count=values["gpu_count"]),
        reason=values["reason"], attempt=values["attempt"], excluded_workers=values["excluded_workers"],
        note=values["note"])


@given(values=container_requested_values())
def test_container_requested_v2_upcasts_to_v3_with_the_same_values(values):
    event = decode(old_message("ContainerRequested", 2, values)).event
    assert event == current_container_requested(values)
    assert event.checkpoint_id == values["checkpoint_id"]


@given(values=container_requested_values())
def test_container_requested_v1_upcasts_to_v3_with_the_same_values(values):
    v1 = dict(values)
    v1["cpu"] = v1.pop("cpu_millicores") / 1000  # v1: cores
    v1["memory"] = v1.pop("memory_mib")
    event = decode(old_message("ContainerRequested", 1, v1)).event
    assert event == current_container_requested(values)


# ---- ContainerScheduled v1 -> v2 -----------------------------------------------------------------

@given(container_id=ids, worker_id=ids, attempt=st.integers(1, 10), checkpoint_id=st.just("") | ids, note=text)
def test_container_scheduled_v1_upcasts_to_v2_with_the_same_values(container_id, worker_id, attempt, checkpoint_id,
                                                                    note):
    v1 = {"container_id": container_id, "worker_id": worker_id, "attempt": attempt, "checkpoint_id": checkpoint_id,
          "note": note}
    event = decode(old_message("ContainerScheduled", 1, v1)).event
    assert event == E.ContainerScheduled(
        container_id=container_id, worker_id=worker_id, attempt=attempt, note=note,
        checkpoint=CheckpointRef(checkpoint_id=checkpoint_id) if checkpoint_id else None)
    assert event.checkpoint_id == checkpoint_id
    assert event.spec is None and event.resources == Resources()  # v1 did not carry them


# ---- the chain itself ----------------------------------------------------------------------------

@given(spec=specs, values=container_requested_values(), ref=checkpoint_refs)
def test_upcasting_never_changes_the_body_it_was_given(spec, values, ref):
    for event_type, version, current, body in [
            ("DeploymentCreated", 1, 2, deployment_created_v1("d-1", 1, spec)),
            ("ContainerRequested", 2, 3, values),
            ("ContainerScheduled", 1, 2, {"container_id": "c", "worker_id": "w", "checkpoint_id": ref.checkpoint_id})]:
        before = copy.deepcopy(body)
        upcast(event_type, version, current, body)
        assert body == before, event_type


def test_a_current_body_is_left_as_it_is():
    body = {"container_id": "c1", "resources": {"cpu_millicores": 5}}
    assert upcast("ContainerRequested", 3, 3, body) == body


# ---- images v1 -> v2 -----------------------------------------------------------------------------

def test_image_events_v1_read_as_v2_with_their_values():
    body = {"image_id": "im-1", "base": "debian:bookworm", "python_packages": ["six"], "commands": ["echo a"]}
    event = decode(old_message("ImageBuildRequested", 1, body)).event
    assert event == E.ImageBuildRequested(image_id="im-1", blueprint=ImageSpec(python_packages=["six"],
                                                                               commands=["echo a"]))
    started = decode(old_message("ImageBuildStarted", 1, {"image_id": "im-1"})).event
    assert isinstance(started, E.ImageBuildStarted) and started.steps == [] and started.builder == ""
    built = decode(old_message("ImageBuilt", 1, {"image_id": "im-1", "digest": "sha256:1", "location": "s3://b/k",
                                                 "size_bytes": 7})).event
    assert built == E.ImageBuilt(image_id="im-1", digest="sha256:1", location="s3://b/k", size_bytes=7)
