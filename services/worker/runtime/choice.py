"""Container runtimes of the worker: what runs a user's app, and how we learn that it ended.

Two implementations behind one interface (levers9.worker.runtime.interface.Runtime):
- `RuncRuntime` (levers9.worker.runtime.runc.runc_runtime): a real container per app (runc, overlay root, own network
  namespace on the worker's bridge, cgroup limits). Needs root on Linux.
- `ProcessRuntime` (levers9.worker.runtime.process): a plain child process. For laptops and tests without root.

`choose_runtime` picks one from `settings.worker.runtime` (runc | process | auto).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from levers9.runtime.config import RuntimeKind, Settings
from levers9.worker.runtime.runc.runc_runtime import RuncRuntime

from .interface import ContainerError, Runtime
from .process import ProcessRuntime


def choose_runtime(settings: Settings, state_dir: Path) -> tuple[Runtime, str]:
    """The runtime `settings.worker.runtime` asks for, and a sentence for the worker's log."""
    wanted = settings.worker.runtime
    missing = runc_missing()
    if wanted == RuntimeKind.RUNC or (wanted == RuntimeKind.AUTO and not missing):
        if missing:
            raise ContainerError(f"runtime 'runc' is not available here: {missing}")
        return RuncRuntime(state_dir, settings), "runc runtime: containers with their own root, " \
                                                 "network namespace and cgroup limits"
    why = "asked for" if wanted == RuntimeKind.PROCESS else missing  # any other value stops Settings.load
    return ProcessRuntime(state_dir, settings), f"process runtime: no isolation and no checkpoints ({why})"


def runc_missing() -> str | None:
    """Why runc cannot be used here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "runc needs Linux"
    if os.geteuid() != 0:
        return "runc needs root"
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    for tool in ("runc", "ip"):
        if not shutil.which(tool, path=path):
            return f"{tool} is not installed"
    return None
