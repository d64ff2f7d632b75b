"""CDI (Container Device Interface) for runc containers: the NVIDIA spec written once per worker with
`nvidia-ctk cdi generate`, and its edits applied to a container's OCI config.json.

runc does not read CDI specs (containerd and podman apply them before they call runc), so the worker
does what they do, in `apply_cdi` (pure): the spec's own containerEdits, then those of each device
given to the container, in order:
- env: KEY=VALUE, replacing the same KEY;
- deviceNodes: linux.devices (type, major and minor read from the host's node when the spec leaves
  them out, as CDI says) and an allow rule in linux.resources.devices (every container starts with
  all devices denied);
- mounts: binds of host paths (the driver's libraries, the persistenced socket, ...);
- hooks: by hookName (createContainer: nvidia-ctk's create-symlinks and update-ldcache);
- additionalGIDs: process.user.additionalGids.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
GENERATE_TIMEOUT_S = 120
DeviceStat = Callable[[str], tuple[str, int, int]]  # host path -> (type "c"|"b", major, minor)


class CdiError(ValueError):
    """A CDI spec that cannot be applied (the message says why)."""


def host_device(path: str) -> tuple[str, int, int]:
    """The type, major and minor of a device node on this host."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise CdiError(f"the CDI spec names the device node {path}, which this host lacks ({exc.strerror})") from exc
    kind = "b" if stat.S_ISBLK(st.st_mode) else "c"
    return kind, os.major(st.st_rdev), os.minor(st.st_rdev)


def device_names(spec: dict[str, Any]) -> list[str]:
    return [d.get("name", "") for d in spec.get("devices", [])]


def cdi_device_names(spec: dict[str, Any], cards: Sequence[tuple[int, str]]) -> list[str]:
    """The spec's names of `cards` ((index, uuid) pairs): the uuid where the spec has it (nvidia-ctk's
    uuid naming strategy), else the index (its default strategy). CdiError when neither is there."""
    names = set(device_names(spec))
    chosen = []
    for index, uuid in cards:
        name = uuid if uuid and uuid in names else str(index)
        if name not in names:
            raise CdiError(f"the CDI spec has no device {uuid or index!r} (it has {sorted(names)})")
        chosen.append(name)
    return chosen


def apply_cdi(config: dict[str, Any], spec: dict[str, Any], devices: Sequence[str],
              stat_device: DeviceStat | None = None) -> dict[str, Any]:
    """A copy of the OCI `config` with the edits of `spec` and of its `devices` (by name) applied."""
    by_name = {d.get("name"): d for d in spec.get("devices", [])}
    missing = [name for name in devices if name not in by_name]
    if missing:
        raise CdiError(f"the CDI spec of kind {spec.get('kind', '?')} has no device(s) {missing}")
    out = copy.deepcopy(config)
    edits = [spec.get("containerEdits") or {}] + [by_name[name].get("containerEdits") or {} for name in devices]
    for edit in edits:
        _apply_edits(out, edit, stat_device or host_device)
    return out


def _apply_edits(config: dict[str, Any], edits: dict[str, Any], stat_device: DeviceStat) -> None:
    process = config.setdefault("process", {})
    if edits.get("env"):
        process["env"] = merge_env(process.get("env", []), edits["env"])
    for node in edits.get("deviceNodes") or []:
        _add_device(config, node, stat_device)
    for m in edits.get("mounts") or []:
        config.setdefault("mounts", []).append(
            {"destination": m["containerPath"], "source": m["hostPath"], "type": m.get("type") or "bind",
             "options": list(m.get("options") or ["ro", "nosuid", "nodev", "bind"])})
    for hook in edits.get("hooks") or []:
        name = hook.get("hookName", "")
        if name not in HOOK_NAMES:
            raise CdiError(f"CDI hook {hook.get('path')} has an unknown hookName {name!r}")
        entry = {k: hook[k] for k in ("path", "args", "env", "timeout") if hook.get(k) is not None}
        config.setdefault("hooks", {}).setdefault(name, []).append(entry)
    gids = edits.get("additionalGIDs") or []
    if gids:
        user = process.setdefault("user", {"uid": 0, "gid": 0})
        user["additionalGids"] = sorted(set(user.get("additionalGids", [])) | set(gids))


def merge_env(env: list[str], extra: list[str]) -> list[str]:
    """`env` with each KEY=VALUE of `extra` set (replacing the same KEY, else appended)."""
    keys = {e.split("=", 1)[0]: i for i, e in enumerate(env)}
    out = list(env)
    for e in extra:
        key = e.split("=", 1)[0]
        if key in keys:
            out[keys[key]] = e
        else:
            keys[key] = len(out)
            out.append(e)
    return out


def _add_device(config: dict[str, Any], node: dict[str, Any], stat_device: DeviceStat) -> None:
    path = node["path"]
    host = node.get("hostPath") or path
    if node.get("major") is None or not node.get("type"):
        kind, major, minor = stat_device(host)
    else:
        kind, major, minor = node["type"], node["major"], node.get("minor", 0)
    linux = config.setdefault("linux", {})
    device = {"path": path, "type": kind, "major": major, "minor": minor}
    for key in ("fileMode", "uid", "gid"):
        if node.get(key) is not None:
            device[key] = node[key]
    devices = linux.setdefault("devices", [])
    if all(d.get("path") != path for d in devices):
        devices.append(device)
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    rules.append({"allow": True, "type": kind, "major": major, "minor": minor,
                  "access": node.get("permissions") or "rwm"})


# ---- the shell: the spec written once per worker ---------------------------------------------------

def nvidia_ctk() -> str | None:
    return shutil.which("nvidia-ctk")


def generate(out: Path, timeout: float = GENERATE_TIMEOUT_S) -> tuple[dict[str, Any] | None, str]:
    """(the spec, a note) from `nvidia-ctk cdi generate` into `out` (JSON, devices named by index and
    by uuid); (None, why) without nvidia-ctk or when it fails."""
    ctk = nvidia_ctk()
    if ctk is None:
        return None, "nvidia-ctk not found: GPUs given by NVIDIA_VISIBLE_DEVICES only (no CDI edits)"
    out.parent.mkdir(parents=True, exist_ok=True)
    base = [ctk, "cdi", "generate", "--format", "json", "--output", str(out)]
    why = ""
    # older nvidia-ctk take one naming strategy only: then the default one (by index)
    for cmd in (base + ["--device-name-strategy", "index", "--device-name-strategy", "uuid"], base):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"nvidia-ctk cdi generate failed ({exc}): NVIDIA_VISIBLE_DEVICES only"
        if done.returncode == 0:
            break
        why = f"exited {done.returncode}: {' | '.join((done.stderr or done.stdout).strip().splitlines()[-3:])}"
    else:
        return None, f"nvidia-ctk cdi generate {why}: NVIDIA_VISIBLE_DEVICES only"
    try:
        spec = json.loads(out.read_text())
    except (OSError, ValueError) as exc:
        return None, f"the CDI spec {out} is unreadable ({exc}): NVIDIA_VISIBLE_DEVICES only"
    return spec, f"CDI spec {out} ({len(spec.get('devices', []))} devices) applied to GPU containers"
