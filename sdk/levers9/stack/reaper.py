"""What `levers9 down` does after stopping the services: every worker of the home that left something
on this machine (a worker SIGKILLed mid-dump: a paused runc container, its overlay and FUSE mounts,
its veth and network namespace, its address claim) is reaped by the worker's own reaper
(`python -m levers9.worker.lifecycle.restart reap ID`, levers9.worker.lifecycle.restart), so nothing of the stack outlives
`down`. A worker whose state dir holds no container, runc state or bucket mount costs nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from .procs import StackError

REAP_TIMEOUT_S = 180


class ReapFailed(StackError):
    pass


def left_something(state_dir: Path) -> bool:
    """Whether a worker's state dir holds anything a reaper would remove."""
    return any(d.is_dir() and any(d.iterdir()) for d in (state_dir / "containers", state_dir / "runc",
                                                          state_dir / "buckets"))


def reap_home(home: Path, progress: Callable[[str], None] = lambda _: None) -> dict[str, list[str]]:
    """Reap every worker of `home` that left something; worker id -> the container ids removed."""
    out: dict[str, list[str]] = {}
    workers = home / "workers"
    for state_dir in sorted(workers.iterdir() if workers.is_dir() else ()):
        if state_dir.is_dir() and left_something(state_dir):
            out[state_dir.name] = reap_worker(home, state_dir.name)
            if out[state_dir.name]:
                progress(f"worker {state_dir.name} left {len(out[state_dir.name])} container(s); removed them "
                         f"with their mounts and namespaces")
    return out


def reap_worker(home: Path, worker_id: str) -> list[str]:
    env = {**os.environ, "LEVERS9_HOME": str(home), "LEVERS9_WORKER_ID": worker_id}
    r = subprocess.run([sys.executable, "-m", "levers9.worker.lifecycle.restart", "reap", worker_id], env=env,
                       capture_output=True, text=True, timeout=REAP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        tail = " | ".join(r.stderr.strip().splitlines()[-3:])
        raise ReapFailed(f"removing what worker {worker_id} left failed: {tail}")
    lines = r.stdout.strip().splitlines()
    return list(json.loads(lines[-1]).get("removed", [])) if lines else []
