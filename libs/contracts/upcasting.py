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
