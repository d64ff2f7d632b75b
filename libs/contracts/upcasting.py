"""Upcasters: one explicit function per (event type, old version), each lifting a body one version.

Bodies are plain dicts here; the chain runs until the body is at the class's current VERSION.
"""

from __future__ import annotations

from typing import Callable

Upcaster = Callable[[dict], dict]

UPCASTERS: dict[tuple[str, int], Upcaster] = {}


class UnknownVersion(ValueError):
    pass


def upcaster(event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    def register(fn: Upcaster) -> Upcaster:
        UPCASTERS[(event_type, from_version)] = fn
        return fn
    return register


def upcast(event_type: str, version: int, current: int, body: dict) -> dict:
    if version > current:
        raise UnknownVersion(
            f"{event_type} version {version} is newer than this build knows ({current}); upgrade levers9")
    if version < 1:
        raise UnknownVersion(f"{event_type} version {version} is not a valid version")
    while version < current:
        step = UPCASTERS.get((event_type, version))
        if step is None:
            raise UnknownVersion(f"no upcaster for {event_type} from version {version}")
        body = step(dict(body))
        version += 1
    return body


@upcaster("ContainerRequested", 1)
def _container_requested_v1(body: dict) -> dict:
    # v1: cpu as fractional cores and memory in MiB under `memory`
    if "cpu" in body:
        body["cpu_millicores"] = int(round(float(body.pop("cpu")) * 1000))
    if "memory" in body:
        body["memory_mib"] = int(body.pop("memory"))
    return body


@upcaster("ContainerRequested", 2)
def _container_requested_v2(body: dict) -> dict:
    # v2: flat resources, `checkpoint_id` + `accelerator`, an unused `image` string
    body["resources"] = {k: body.pop(k) for k in ("cpu_millicores", "memory_mib", "gpu", "gpu_count") if k in body}
    checkpoint_id, accelerator = body.pop("checkpoint_id", ""), body.pop("accelerator", "")
    if checkpoint_id:
        body["checkpoint"] = {"checkpoint_id": checkpoint_id, "accelerator": accelerator}
    body.pop("image", None)
    return body


@upcaster("ContainerScheduled", 1)
def _container_scheduled_v1(body: dict) -> dict:
    # v1: only the worker, the attempt and a checkpoint id; the worker read the rest from its tables
    checkpoint_id = body.pop("checkpoint_id", "")
    if checkpoint_id:
        body["checkpoint"] = {"checkpoint_id": checkpoint_id}
    return body


@upcaster("DeploymentCreated", 1)
def _deployment_created_v1(body: dict) -> dict:
    # v1: every option a flat field; the image a JSON string
    import json

    def take(*keys: str) -> dict:
        return {k: body.pop(k) for k in keys if k in body}

    code = take("kind", "module", "handler", "on_start")
    code.update({new: body.pop(old) for old, new in (("code_sha256", "sha256"), ("code_key", "key")) if old in body})
    image = body.pop("image", "")
    spec = {"name": body.get("name", ""), "code": code,
            "resources": take("cpu_millicores", "memory_mib", "gpu", "gpu_count"),
            "scaling": take("keep_warm_seconds", "min_containers", "max_containers", "concurrency"),
            **take("app_name", "timeout_seconds", "secrets", "env", "checkpoint_enabled", "pool")}
    if image:
        spec["image"] = json.loads(image) if isinstance(image, str) else image
    body["spec"] = spec
    return body


@upcaster("ImageBuildRequested", 1)
def _image_build_requested_v1(body: dict) -> dict:
    # v1: base (a name that was never built), python_packages and commands flat
    body.pop("base", None)
    body["blueprint"] = {"python_packages": body.pop("python_packages", []),
                         "commands": body.pop("commands", [])}
    return body


@upcaster("ImageBuildStarted", 1)
def _image_build_started_v1(body: dict) -> dict:
    # v1 knew only the builder; nothing was ever built from it
    body.setdefault("builder", "")
    body.setdefault("blueprint", {})
    body.setdefault("steps", [])
    return body


@upcaster("ImageBuilt", 1)
def _image_built_v1(body: dict) -> dict:
    # v1: digest, location and size only; no archive
    return body
