"""What the worker makes of a box (pure): the container's process and environment, whether this
worker may run it, when its port counts as ready, and the sentences a failure is reported with.

A box (code.kind "box", levers9.contracts.spec.BoxOptions) runs the tenant's command as the
container's process in place of the runner, confined like every container (the runc runtime:
seccomp, firewall, limits). The worker never runs that command on the host: a runtime without
isolation (the process runtime) refuses boxes. Readiness is a probe from the worker to the
container's address, a TCP connect or a GET of `ready_path` (levers9.worker.lifecycle.box_probe),
instead of the runner's health report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from levers9.contracts.spec import BoxOptions, DeploymentSpec
from levers9.worker.runtime.interface import Capabilities, Exit


def box_of(spec: DeploymentSpec | None) -> BoxOptions | None:
    """The box options of a box's spec; None for anything else."""
    return spec.box if spec is not None and spec.code.kind == "box" else None


def refusal(spec: DeploymentSpec | None, capabilities: Capabilities, runtime: str) -> str:
    """Why this worker will not run the placement's box ("" when it will, or when it is no box)."""
    if box_of(spec) is None or capabilities.isolation:
        return ""
    return (f"a box runs only in an isolated container (the runc runtime); this worker runs the {runtime} "
            "runtime, which would run its command on the host")


def container_fields(box: BoxOptions) -> dict[str, Any]:
    """The ContainerSpec fields of a box: its command as the process, its port as where it listens."""
    return {"command": tuple(box.command), "port": box.port}


def box_env(spec: DeploymentSpec, secrets: dict[str, str], *, container_id: str,
            deployment_id: str) -> dict[str, str]:
    """A box's environment: PORT (the port it should listen on), its image's env, the spec's env over
    it, its secrets over that, and which container and deployment it is. None of the runner's settings:
    no runner runs."""
    assert spec.box is not None
    image_env = spec.image.env if spec.image else {}
    return {"PORT": str(spec.box.port), **image_env, **spec.env, **secrets,
            "LEVERS9_CONTAINER_ID": container_id, "LEVERS9_DEPLOYMENT_ID": deployment_id}


@dataclass(frozen=True)
class Probe:
    """What one readiness probe saw: whether the port took the connection, the status of the GET of
    `ready_path` when the box has one, and why not in a few words."""
    connected: bool
    status: int | None = None
    error: str = ""


def ready(box: BoxOptions, probe: Probe) -> bool:
    """Whether the box is ready: its port took a connection, or its ready_path answered 2xx."""
    if box.ready_path is None:
        return probe.connected
    return probe.status is not None and 200 <= probe.status < 300


def program(box: BoxOptions) -> str:
    return box.command[0][:200]


def ended(box: BoxOptions, exit: Exit, was_ready: bool) -> Exit:
    """The Exit a box's failure is reported with: its command and port named beside how it ended
    (the worker appends the log's last lines). Out of memory and a requested stop keep their own words."""
    if exit.oom or exit.reason == "stopped":
        return exit
    when = f"after it answered on port {box.port}" if was_ready else f"before port {box.port} answered"
    return Exit(exit.code, f"the box's command ({program(box)}) {exit.reason} {when}", exit.oom)


def not_ready(box: BoxOptions, timeout: float, last: Probe | None) -> str:
    """Why a box that still runs was given up on: its port did not answer within its start timeout."""
    what = f"GET {box.ready_path} on port {box.port} did not answer 2xx" if box.ready_path \
        else f"port {box.port} did not accept a connection"
    seen = ""
    if last is not None and last.status is not None:
        seen = f" (last answer: {last.status})"
    elif last is not None and last.error:
        seen = f" (last try: {last.error})"
    return f"the box's command ({program(box)}) runs but {what} within {timeout:.0f} s{seen}"


def target(address: str) -> tuple[str, int]:
    """(host, port) of a container's address ("http://IP:PORT"), which the probe connects to."""
    parts = urlsplit(address)
    if not parts.hostname or parts.port is None:
        raise ValueError(f"address {address!r} names no host and port")
    return parts.hostname, parts.port
