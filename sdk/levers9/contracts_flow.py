"""Which services append each event type and which consume it, read from their source (`ast`).

`levers9 contracts flow` prints it; tests/unit/test_contracts_flow.py checks it against the code.
Nothing is imported or run: the installed packages' files are found by import name (so it works from
a wheel as from the repository) and parsed.

What counts, per module:
- appends X: a call that constructs the event class X (`E.X(...)`, `X(...)`, `caused_by(cause, E.X(...))`:
  every event reaches the log through `envelope(event, ...)` and `Bus.publish`/`Bus.append`);
- consumes X: any other mention of X outside annotations: `isinstance(ev, E.X)`, `case E.X():`, a
  string "X" (consumer filters `filter_subject(event_type="X")`, dicts keyed by the envelope's type).
A service's modules also bring what the shared library code they use does: a projection of
levers9.runtime (views.py) consumes for every service that uses it; runtime.tokens.mint appends
TokenCreated for every service that mints. That is followed symbol by symbol (a class or function
of levers9.runtime and what it mentions), never by whole modules.

An event that no service appends is either a mistake or published by other systems: EXTERNAL names
the latter, with why.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the processes, by import name; "cli" is the SDK and the `levers9` command
ACTORS = {
    "levers9.gateway": "gateway",
    "levers9.scheduler": "scheduler",
    "levers9.pool_controller": "pool-controller",
    "levers9.worker": "worker",
    "levers9.checkpoint_store": "checkpoint-store",
    "levers9.image_builder": "image-builder",
    "levers9.dashboard": "dashboard",  # a client of the gateway: it appends and consumes nothing itself
    "levers9": "cli",
}
LIBS = ("levers9.runtime",)  # shared code: attributed to the actors that use it
CONTRACTS = "levers9.contracts"  # the event classes themselves: neither appends nor consumes
# who may sign which type: tables of type names that every publish and delivery passes, not reads
PERMISSIONS = ("levers9.runtime.nats_auth", "levers9.runtime.bus_signing")

# published by other systems (or by an operator with their credentials), never by a levers9 process
EXTERNAL: dict[str, str] = {
    "WorkerDrained": "no levers9 process appends it today (DESIGN.md has the pool-controller drain idle "
                     "workers); the operator's tools may (the admin signs any power event)",
}

Symbol = tuple[str, str]  # (module, top-level name)


@dataclass
class Uses:
    """What a piece of code appends and consumes, and the library symbols it refers to."""
    appends: set[str] = field(default_factory=set)
    consumes: set[str] = field(default_factory=set)
    refs: set[Symbol] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)  # event-type-like names that are not event types

    def add(self, other: Uses) -> None:
        self.appends |= other.appends
        self.consumes |= other.consumes
        self.refs |= other.refs
        self.unknown |= other.unknown


@dataclass(frozen=True)
class Flow:
    """Per event type: who appends it, who consumes it; and names used as event types that are none."""
    appended_by: dict[str, list[str]]
    consumed_by: dict[str, list[str]]
    unknown: dict[str, list[str]]  # actor -> names

    def rows(self, aggregates: dict[str, str]) -> list[dict[str, Any]]:
        """One row per event type, by aggregate then name (what `levers9 contracts flow --json` prints)."""
        return [{"type": t, "aggregate": aggregates.get(t, ""), "appended_by": self.appended_by.get(t, []),
                 "consumed_by": self.consumed_by.get(t, []), "external": EXTERNAL.get(t, "")}
                for t in sorted(aggregates, key=lambda t: (aggregates[t], t))]


def _under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def actor_of(module: str) -> str | None:
    """The actor a module belongs to (the longest ACTORS name that prefixes it); None for libs and contracts."""
    if _under(module, *LIBS, CONTRACTS):
        return None
    owners = [name for name in ACTORS if _under(module, name)]
    return ACTORS[max(owners, key=len)] if owners else None


def resolve_import(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a (possibly relative) import in `module`."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


class _Names:
    """What the names bound by a module's imports stand for: the events package, an event class, a
    library module or a library symbol."""

    def __init__(self, module: str, is_package: bool, tree: ast.Module, modules: set[str], types: set[str]):
        self.event_modules: set[str] = set()  # names bound to levers9.contracts.events (or a module of it)
        self.event_classes: dict[str, str] = {}  # local name -> event type
        self.lib_modules: dict[str, str] = {}  # local name -> library module
        self.lib_symbols: dict[str, Symbol] = {}  # local name -> (library module, name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self._bind(alias.asname or alias.name.split(".")[0], alias.name, None, modules, types,
                               whole=alias.asname is not None)
            elif isinstance(node, ast.ImportFrom):
                source = resolve_import(module, is_package, node.level, node.module)
                for alias in node.names:
                    self._bind(alias.asname or alias.name, source, alias.name, modules, types, whole=True)

    def _bind(self, local: str, source: str, name: str | None, modules: set[str], types: set[str],
              whole: bool) -> None:
        target = f"{source}.{name}" if name else source
        if name and _under(source, CONTRACTS) and name in types:
            self.event_classes[local] = name
        elif whole and _under(target, CONTRACTS + ".events"):
            self.event_modules.add(local)
        elif _under(target, *LIBS) and target in modules and whole:
            self.lib_modules[local] = target
        elif name and _under(source, *LIBS) and source in modules:
            self.lib_symbols[local] = (source, name)


class _Visitor(ast.NodeVisitor):
    """Collects Uses for one piece of code (a top-level definition, or a whole module)."""

    def __init__(self, names: _Names, types: set[str], own: dict[str, Symbol]):
        self.names, self.types, self.own, self.uses = names, types, own, Uses()
        self.constructing: set[int] = set()

    def event_of(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.names.event_classes.get(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in self.names.event_modules:
            if node.attr in self.types:
                return node.attr
            if node.attr[:1].isupper() and node.attr not in ("Event", "AnyEvent", "EVENT_TYPES"):
                self.uses.unknown.add(node.attr)
        return None

    def visit_Call(self, node: ast.Call) -> None:
        made = self.event_of(node.func)
        if made:
            self.uses.appends.add(made)
            self.constructing.add(id(node.func))
        for kw in node.keywords:
            if kw.arg == "event_type" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str) \
                    and kw.value.value not in self.types:
                self.uses.unknown.add(kw.value.value)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        self._mention(node)
        if node.id in self.names.lib_symbols:
            self.uses.refs.add(self.names.lib_symbols[node.id])
        elif node.id in self.own:
            self.uses.refs.add(self.own[node.id])

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._mention(node)
        if isinstance(node.value, ast.Name) and node.value.id in self.names.lib_modules:
            self.uses.refs.add((self.names.lib_modules[node.value.id], node.attr))
        self.generic_visit(node)

    def _mention(self, node: ast.expr) -> None:
        if id(node) not in self.constructing:
            found = self.event_of(node)
            if found:
                self.uses.consumes.add(found)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and node.value in self.types:
            self.uses.consumes.add(node.value)

    # annotations say what a value is, not that it is read or written
    def visit_arg(self, node: ast.arg) -> None:
        pass

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        for item in [*node.decorator_list, *node.body]:
            self.visit(item)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Expr(self, node: ast.Expr) -> None:
        if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):  # docstrings
            self.generic_visit(node)


def _top_level_names(tree: ast.Module) -> list[tuple[str, list[ast.stmt]]]:
    """Each top-level definition or assignment with the statements it is; the rest under ''."""
    out: list[tuple[str, list[ast.stmt]]] = []
    rest: list[ast.stmt] = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((stmt.name, [stmt]))
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            out += [(t.id, [stmt]) for t in stmt.targets if isinstance(t, ast.Name)]
        elif not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            rest.append(stmt)
    return [*out, ("", rest)]


def module_uses(module: str, source: str, modules: set[str], types: set[str], is_package: bool = False,
                ) -> dict[str, Uses]:
    """Uses of each top-level name of one module ('' for its other statements)."""
    tree = ast.parse(source)
    names = _Names(module, is_package, tree, modules, types)
    defined = _top_level_names(tree)
    own = {name: (module, name) for name, _ in defined if name}
    found: dict[str, Uses] = {}
    for name, statements in defined:
        visitor = _Visitor(names, types, {k: v for k, v in own.items() if k != name})
        for stmt in statements:
            visitor.visit(stmt)
        found.setdefault(name, Uses()).add(visitor.uses)
    for local, symbol in names.lib_symbols.items():  # a re-exported library name stands for its origin
        found.setdefault(local, Uses()).refs.add(symbol)
    return found


def analyse(sources: dict[str, tuple[str, bool]], types: set[str]) -> Flow:
    """sources: module name -> (its source, whether it is a package's __init__). Pure: no I/O."""
    modules = set(sources)
    per_symbol: dict[Symbol, Uses] = {}
    per_actor: dict[str, Uses] = {}
    for module, (source, is_package) in sorted(sources.items()):
        uses = module_uses(module, source, modules, types, is_package)
        actor = actor_of(module)
        if actor is None:
            for u in uses.values() if module in PERMISSIONS else ():
                u.consumes.clear()
            per_symbol.update({(module, name): u for name, u in uses.items()})
            continue
        total = per_actor.setdefault(actor, Uses())
        for u in uses.values():
            total.add(u)
    appended: dict[str, set[str]] = {}
    consumed: dict[str, set[str]] = {}
    unknown: dict[str, list[str]] = {}
    for actor, total in per_actor.items():
        seen: set[Symbol] = set()
        todo = list(total.refs)
        while todo:  # the library code this actor uses, symbol by symbol
            symbol = todo.pop()
            if symbol in seen or symbol not in per_symbol:
                continue
            seen.add(symbol)
            lib = per_symbol[symbol]
            total.appends |= lib.appends
            total.consumes |= lib.consumes
            total.unknown |= lib.unknown
            todo += lib.refs
        for t in total.appends:
            appended.setdefault(t, set()).add(actor)
        for t in total.consumes:
            consumed.setdefault(t, set()).add(actor)
        if total.unknown:
            unknown[actor] = sorted(total.unknown)
    return Flow({t: sorted(a) for t, a in appended.items()}, {t: sorted(a) for t, a in consumed.items()}, unknown)


def installed_sources() -> dict[str, tuple[str, bool]]:
    """Every module of the actors and libs, from wherever they are installed (found, not imported)."""
    sources: dict[str, tuple[str, bool]] = {}
    for root in [*ACTORS, *LIBS]:
        spec = importlib.util.find_spec(root)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            sources.update(sources_under(root, Path(folder)))
    return sources


def sources_under(root: str, folder: Path) -> dict[str, tuple[str, bool]]:
    """The modules of package `root` in `folder`; a package with its own root (levers9.gateway inside
    levers9/ in a wheel) is left to that root, and the contracts are not read."""
    others = [r for r in [*ACTORS, *LIBS, CONTRACTS] if r != root and _under(r, root)]
    found: dict[str, tuple[str, bool]] = {}
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if "__pycache__" in parts:
            continue
        is_package = parts[-1] == "__init__"
        name = ".".join([root, *(parts[:-1] if is_package else parts)])
        if not _under(name, *others) and name != __name__:  # this analysis names types, reading none
            found[name] = (path.read_text(encoding="utf-8"), is_package)
    return found
