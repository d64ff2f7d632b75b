"""Fails when a module is over 500 lines or a function over 60 lines (outside tests/ and bench/).

Small modules named for what they do, and functions that fit on a screen: checked in CI, not hoped for.
Usage: python scripts/check_sizes.py [PATH ...]   (default: libs services sdk)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
ROOTS = ("libs", "services", "sdk")


def problems(path: Path) -> list[str]:
    text = path.read_text()
    out = []
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    if lines > MAX_MODULE_LINES:
        out.append(f"{path}: {lines} lines (max {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out.append(f"{path}:{node.lineno}: function {node.name} is {length} lines (max {MAX_FUNCTION_LINES})")
    return out


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    targets = [Path(a) for a in argv] or [root / r for r in ROOTS]
    files = sorted(f for t in targets for f in ([t] if t.is_file() else t.rglob("*.py")))
    found = [p for f in files for p in problems(f)]
    for line in found:
        print(line)
    print(f"check_sizes: {len(files)} modules, {len(found)} over the limits")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
