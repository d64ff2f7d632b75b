"""A valid example of every event, for `levers9 events example` and for publishers' tests."""

from __future__ import annotations

import msgspec

from .envelope import Envelope, envelope
from .events import EVENT_TYPES
from .ids import uuid7
from .images import build_steps
from .spec import Code, DeploymentSpec, ImageSpec

_SAMPLES = {
    "worker_id": "worker-1", "pool": "default", "address": "http://10.90.0.2:8000", "sha256": "0" * 64,
    "reason": "example", "name": "hello", "stage": "upload", "bucket": "levers9-default",
    "key": "checkpoints/example.tar", "location": "http://127.0.0.1:2050/blobs/" + "0" * 64, "digest": "sha256:" + "0" * 64,
    "token_sha256": "0" * 64,
}


def _sample(name: str, annotation: object) -> object:
    if annotation is DeploymentSpec:
        return DeploymentSpec(name="hello", app_name="hello", code=Code(module="hello", handler="hello"))
    if annotation is ImageSpec:
        return ImageSpec(python_packages=["humanize==4.9.0"], commands=["echo built"], env={"GREETING": "hi"})
    if name == "steps":
        return build_steps(ImageSpec(python_packages=["humanize==4.9.0"], commands=["echo built"]))
    if name == "state":
        return "running"
    if name in ("step", "total"):
        return 1
    if name in _SAMPLES:
        return _SAMPLES[name]
    if name.endswith("_id"):
        return uuid7()
    if annotation is int or annotation == (int | None):
        return 1
    if annotation is bool:
        return False
    if annotation is float:
        return 1.0
    return "example"


def example_envelope(event_type: str, workspace: str = "default") -> Envelope:
    cls = EVENT_TYPES[event_type]
    values = {f.name: _sample(f.name, f.type) for f in msgspec.structs.fields(cls) if f.required}
    return envelope(cls(**values), workspace=workspace)
