"""What a container's runner imports before its first call: none of the SDK's user-facing modules
(`levers9` resolves App, Sandbox, ... when first used) and no importlib.metadata (only a package
check needs it). Each of them cost every sandbox's and ad-hoc function's cold start tens of ms."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SDK = Path(__file__).resolve().parents[2] / "sdk"
NOT_AT_START = ("levers9.app", "levers9.options", "levers9.functions", "levers9.sandbox", "levers9.client",
                "importlib.metadata")


def imported_by(statement: str) -> set[str]:
    """The modules a bare python3 (no site-packages, as in a container) holds after `statement`."""
    code = f"import sys, json; sys.path.insert(0, {str(SDK)!r}); {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return set(json.loads(out.stdout))


def test_the_runner_starts_without_the_sdks_user_facing_modules():
    loaded = imported_by("import levers9.runner.main")
    assert not loaded & set(NOT_AT_START), sorted(loaded & set(NOT_AT_START))


def test_the_sdks_names_still_come_from_the_package():
    loaded = imported_by("from levers9 import App, Sandbox, Volume, TaskQueue, FunctionError, load_app_file")
    assert {"levers9.app", "levers9.sandbox", "levers9.volumes", "levers9.task_queues"} <= loaded
    assert "levers9.client" not in loaded  # the SDK's own rule: a user's file imports no HTTP client
