"""Sandboxes as plain values and pure decisions: the create request, the deployment it runs in, its
status from its container's, and when its lifetime is over. No I/O.

A sandbox is one container of a sandbox deployment: an ad-hoc function sandbox (code.kind
"function", no module) whose spec carries `sandbox` (its workdir and lifetime). Sandboxes with the
same options share that deployment (`sb-<hash>`), as ad-hoc functions share theirs; each is its own
container, requested for it alone (ContainerRequested.session_id `sandbox-<id>`: the autoscaler
neither counts nor stops it, the worker's keep-warm rule is its idle timeout).
"""

from __future__ import annotations

import hashlib
from typing import Annotated

import msgspec
from msgspec import Meta

from .spec import (
    MAX_CPU_MILLICORES,
    MAX_MEMORY_MIB,
    MIN_MEMORY_MIB,
    Code,
    DeploymentSpec,
    EnvName,
    FunctionOptions,
    ImageSpec,
    InvalidSpec,
    Name,
    PoolName,
    Resources,
    SandboxDir,
    SandboxOptions,
    Scaling,
)

SESSION_PREFIX = "sandbox-"
DEPLOYMENT_PREFIX = "sb-"
LIVE = ("requested", "pending", "scheduled", "starting", "ready")


class SandboxRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/sandboxes: one unit per quantity (millicores, MiB, seconds)."""
    app: Name = "sandboxes"
    image: ImageSpec | None = None
    cpu_millicores: Annotated[int, Meta(gt=0, le=MAX_CPU_MILLICORES)] = 1000
    memory_mib: Annotated[int, Meta(ge=MIN_MEMORY_MIB, le=MAX_MEMORY_MIB)] = 1024
    timeout: Annotated[int, Meta(ge=1, le=7 * 86_400)] = 3600  # its lifetime
    idle_timeout: Annotated[int, Meta(ge=1, le=86_400)] = 600  # stopped after this long with nothing running
    workdir: SandboxDir = "/sandbox"
    env: dict[EnvName, str] = {}
    secrets: list[EnvName] = []
    pool: PoolName = "default"
    from_snapshot: str = ""  # a checkpoint id (sandbox.snapshot()): restore it instead of starting fresh


def decode_request(body: bytes) -> SandboxRequest:
    """The create request; InvalidSpec with a sentence naming the field."""
    try:
        req = msgspec.json.decode(body or b"{}", type=SandboxRequest)
    except msgspec.ValidationError as exc:
        raise InvalidSpec(f"the sandbox request is not valid: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidSpec(f"the sandbox request is not JSON: {exc}") from None
    try:
        SandboxOptions(workdir=req.workdir, timeout_seconds=req.timeout)
    except ValueError as exc:
        raise InvalidSpec(f"the sandbox request is not valid: {exc} - at `$.workdir`") from None
    return req


def sandbox_spec(req: SandboxRequest) -> DeploymentSpec:
    """The deployment a fresh sandbox of `req` runs in (named after the hash of its options)."""
    spec = DeploymentSpec(
        name="sb-pending", app_name=req.app, code=Code(kind="function", module="", handler=""), image=req.image,
        resources=Resources(cpu_millicores=req.cpu_millicores, memory_mib=req.memory_mib),
        scaling=Scaling(keep_warm_seconds=req.idle_timeout, max_containers=1000, concurrency=1),
        timeout_seconds=max(60, min(req.timeout, 86_400)), env=dict(req.env), secrets=list(req.secrets),
        pool=req.pool, function=FunctionOptions(shared_checkpoints=False),
        sandbox=SandboxOptions(workdir=req.workdir, timeout_seconds=req.timeout))
    digest = hashlib.sha256(msgspec.json.encode(spec)).hexdigest()[:16]
    return msgspec.structs.replace(spec, name=f"{DEPLOYMENT_PREFIX}{digest}")


def session_of(sandbox_id: str) -> str:
    return SESSION_PREFIX + sandbox_id


def status_of(container_status: str) -> str:
    """A sandbox's status from its container's: starting | running | terminated | failed."""
    if container_status == "ready":
        return "running"
    if container_status in LIVE:
        return "starting"
    return "failed" if container_status == "failed" else "terminated"


def expired(now: float, created_at: float, timeout_s: float) -> str | None:
    """Why a sandbox must end now (its lifetime ran out), or None while it may run on."""
    if now - created_at < timeout_s:
        return None
    return f"sandbox timeout: it ran its lifetime of {timeout_s:g} s"
