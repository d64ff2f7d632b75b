"""The import graph of levers9 has no cycles, and no service imports another service.

Every `.py` under the folders of pyproject's `[tool.setuptools.package-dir]` is parsed with `ast`
(nothing is imported), named by that mapping (levers9.gateway -> services/gateway, ...), and every
import anywhere in it becomes an edge: top level, under `if TYPE_CHECKING:`, inside functions;
relative imports resolved; `from pkg import name` is an edge to `pkg.name` when that is a module.
A cycle held apart by a `TYPE_CHECKING` guard or a late, function-level import is still a cycle
here: DESIGN.md's layers import downward only, so no late imports are needed to hide one.

Importing a submodule also runs its parents' `__init__`, but that is not an edge: a package whose
`__init__` re-exports its submodules would otherwise be a cycle with each of them.
"""

from __future__ import annotations

import ast
import tomllib
from collections import defaultdict
from functools import cache
from pathlib import Path

from levers9.contracts_flow import resolve_import

ROOT = Path(__file__).resolve().parents[2]


def package_dirs() -> dict[str, Path]:
    """Import name -> folder, as pyproject maps them."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in mapping.items()}


def module_files(mapping: dict[str, Path]) -> dict[str, Path]:
    """Every module's import name -> its file; a folder mapped on its own belongs to that name only."""
    roots = {folder.resolve() for folder in mapping.values()}
    found: dict[str, Path] = {}
    for name, folder in mapping.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder)
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            if any(p.resolve() in roots for p in path.parents if p != folder and folder in p.parents):
                continue  # under another mapped folder: named by that mapping
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([name, *parts])] = path
    return found


def _known(name: str, modules: set[str]) -> str | None:
    """The longest prefix of `name` that is one of our modules (None: not ours)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return None


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of ours that `module` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    edges: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = resolve_import(module, is_package, node.level, node.module)
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        else:
            continue
        edges |= {k for t in targets if (k := _known(t, modules)) and k != module}
    return edges


@cache
def graph() -> dict[str, set[str]]:
    files = module_files(package_dirs())
    names = set(files)
    return {name: imports_of(name, path, names) for name, path in files.items()}


def strongly_connected(g: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components (iterative), each sorted; only those of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(g.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def top_package(module: str) -> str:
    """The mapped package a module belongs to (the longest mapped name that prefixes it)."""
    return max((n for n in package_dirs() if module == n or module.startswith(n + ".")), key=len)


def cycles_by_package() -> dict[str, list[list[str]]]:
    """Each cycle under the mapped package all its modules belong to ("mixed" when they differ)."""
    grouped: dict[str, list[list[str]]] = defaultdict(list)
    for component in strongly_connected(graph()):
        owners = {top_package(m) for m in component}
        grouped[owners.pop() if len(owners) == 1 else "mixed"].append(component)
    return grouped


def describe(cycles: list[list[str]]) -> str:
    lines = []
    g = graph()
    for component in cycles:
        members = set(component)
        lines.append("cycle: " + ", ".join(component))
        lines += [f"    {m} -> {', '.join(sorted(g[m] & members))}" for m in component]
    return "\n".join(lines)


def test_the_graph_sees_the_packages_and_their_imports():
    """A guard on the parser itself: the mapping is read, and known edges of each kind are seen."""
    g = graph()
    assert {"levers9.cli", "levers9.contracts.events", "levers9.gateway.service", "levers9.runtime.bus"} <= set(g)
    assert "levers9.contracts.events.base" in g["levers9.contracts.events.container"]  # relative, submodule
    assert "levers9.contracts.events" in g["levers9.contracts.schema"]  # from .events import NAME
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_anywhere():
    cycles = [c for found in cycles_by_package().values() for c in found]
    assert not cycles, "import cycles (move the shared piece into its own module):\n" + describe(cycles)


def test_no_service_imports_another_service_and_libs_import_none():
    """DESIGN.md: no service imports another service's package; shared code lives in libs/."""
    dirs = package_dirs()
    services = {n for n, d in dirs.items() if d.relative_to(ROOT).parts[0] == "services"}
    libs = {n for n, d in dirs.items() if d.relative_to(ROOT).parts[0] == "libs"}
    assert {"levers9.gateway", "levers9.scheduler", "levers9.worker"} <= services
    assert {"levers9.contracts", "levers9.runtime"} <= libs
    wrong = []
    for module, targets in sorted(graph().items()):
        owner = top_package(module)
        if owner not in services | libs:
            continue
        for target in sorted(targets):
            other = top_package(target)
            if other in services and other != owner:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "a service (or a lib) imports a service:\n" + "\n".join(wrong)
