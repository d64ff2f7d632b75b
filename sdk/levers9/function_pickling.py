"""Pickling for function calls: the function (by value for the caller's own modules), its
arguments (checked before anything is sent), the modules its source imports, and turning a Result
back into a value or an exception that carries the remote traceback.

Never imported inside a container (it needs cloudpickle); levers9.function_calls uses it.
"""

from __future__ import annotations

import ast
import inspect
import sys
import sysconfig
import threading
import types
from pathlib import Path
from typing import Any, Callable

import cloudpickle

from levers9.function_errors import ArgumentError, FunctionError, RemoteError, RemoteTraceback, ResultError

_by_value_lock = threading.Lock()  # cloudpickle's by-value registry is process-wide


# ---- whose module is it --------------------------------------------------------------------------

def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]


_INSTALLED = _installed_roots()


def is_own_module(module: types.ModuleType | None) -> bool:
    """Whether a module is the caller's own code: a file outside the standard library and installed
    packages (and not levers9). The sandbox does not have such modules: they travel by value."""
    if module is None:
        return False
    name = module.__name__
    if name == "__main__":
        return True
    top = name.split(".")[0]
    file = getattr(module, "__file__", None)
    if top in sys.stdlib_module_names or top == "levers9" or not file:
        return False
    path = Path(file).resolve()
    if {"site-packages", "dist-packages"} & set(path.parts):
        return False
    return not any(path.is_relative_to(root) for root in _INSTALLED)


def _top_level_modules(names: list[str]) -> list[types.ModuleType]:
    """The loaded own top-level modules (or packages) among names."""
    found = []
    for name in names:
        module = sys.modules.get(name)
        if module is not None and name != "__main__" and is_own_module(module):
            found.append(module)
    return found


# ---- the function --------------------------------------------------------------------------------

def _sources(func: Callable[..., Any]) -> list[str]:
    """The text of the function's module file, and of the function itself when there is no file."""
    texts = []
    try:
        file = inspect.getsourcefile(func)
        if file and Path(file).is_file():
            texts.append(Path(file).read_text(errors="replace"))
    except (TypeError, OSError):
        pass
    if not texts:
        try:
            texts.append(inspect.getsource(func))
        except (TypeError, OSError):
            pass
    return texts


def imported_names(func: Callable[..., Any]) -> list[str]:
    """Top-level modules the function's module (or source) imports, found with ast: every one but
    the standard library's, levers9 and `__future__`, relative imports excluded. Sorted."""
    names: set[str] = set()
    for text in _sources(func):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    excluded = set(sys.stdlib_module_names) | {"levers9", "__future__"}
    return sorted(n for n in names if n not in excluded)


def third_party(names: list[str]) -> list[str]:
    """The names that are not the caller's own modules: what the sandbox must import (or install)."""
    own = {m.__name__ for m in _top_level_modules(names)}
    return [n for n in names if n not in own]


def pickle_function(func: Callable[..., Any], imports: list[str]) -> bytes:
    """cloudpickle.dumps(func), with the function's module and the caller's own imported modules
    pickled by value (the sandbox has only installed packages); the registry is restored after."""
    module = sys.modules.get(getattr(func, "__module__", "") or "")
    modules = _top_level_modules(imports)
    if module is not None and module.__name__ != "__main__" and is_own_module(module):
        modules.append(module)
    with _by_value_lock:
        registered = set(cloudpickle.list_registry_pickle_by_value())
        added = [m for m in {m.__name__: m for m in modules}.values() if m.__name__ not in registered]
        for m in added:
            cloudpickle.register_pickle_by_value(m)
        try:
            return cloudpickle.dumps(func)
        except Exception as exc:  # noqa: BLE001 - whatever fails pickling, named with the fix
            name = getattr(func, "__qualname__", repr(func))
            raise FunctionError(f"the function {name} cannot be pickled ({type(exc).__name__}: {exc}): move what it "
                                "uses that cannot be pickled (locks, connections, open files) inside it") from None
        finally:
            for m in added:
                cloudpickle.unregister_pickle_by_value(m)


# ---- arguments -----------------------------------------------------------------------------------

def pickle_args(args: tuple[Any, ...], kwargs: dict[str, Any], name: str, index: int | None = None) -> bytes:
    """cloudpickle.dumps((args, kwargs)); an argument that cannot be pickled raises ArgumentError
    naming it and its type (and, for a map, which input it was)."""
    try:
        return cloudpickle.dumps((args, kwargs))
    except Exception as exc:  # noqa: BLE001 - find which argument failed and say so
        cause = exc
    which = f"input {index} of {name}" if index is not None else name
    culprits = [(f"argument {i + 1}", a) for i, a in enumerate(args)] + \
               [(f"keyword argument {k}", v) for k, v in kwargs.items()]
    for label, value in culprits:
        try:
            cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001
            kind = f"{type(value).__module__}.{type(value).__qualname__}"
            raise ArgumentError(f"{label} of {which} cannot be pickled: it is a {kind} ({type(exc).__name__}: "
                                f"{exc}): pass plain data, or create it inside the function; nothing was "
                                "sent") from None
    raise ArgumentError(f"the arguments of {which} cannot be pickled ({type(cause).__name__}: {cause}); nothing "
                        "was sent") from None


# ---- results -------------------------------------------------------------------------------------

def load_value(data: bytes, what: str) -> Any:
    """cloudpickle.loads(data); a value whose type cannot be imported here raises ResultError naming it."""
    try:
        return cloudpickle.loads(data)
    except ModuleNotFoundError as exc:
        raise ResultError(f"{what} cannot be unpickled here: its type's module {exc.name!r} is not installed "
                          f"locally ({exc}): install {exc.name} here, or return plain Python types") from None
    except Exception as exc:  # noqa: BLE001 - AttributeError (a renamed class), ImportError, a bad __setstate__
        raise ResultError(f"{what} cannot be unpickled here ({type(exc).__name__}: {exc}): the local code must "
                          "define the same types as the sandbox's; or return plain Python types") from None


def attach_traceback(exc: BaseException, text: str) -> BaseException:
    """Set the remote traceback as exc.__cause__ (a RemoteTraceback) and exc.remote_traceback."""
    if not text:
        return exc
    try:
        exc.__cause__ = RemoteTraceback(text)
        exc.remote_traceback = text  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # an exception type with __slots__ or a read-only attribute
        pass
    return exc


def remote_exception(value: bytes, error_type: str, error: str, traceback: str,
                     correlation_id: str = "") -> BaseException:
    """The function's exception as its own type when it unpickles here, else a RemoteError; either
    way with the remote traceback attached."""
    exc: BaseException | None = None
    if value:
        try:
            loaded = cloudpickle.loads(value)
        except Exception:  # noqa: BLE001 - its type does not exist here: RemoteError below
            loaded = None
        if isinstance(loaded, BaseException):
            exc = loaded
    if exc is None:
        exc = RemoteError(error_type or "Exception", error, traceback, correlation_id)
    return attach_traceback(exc, traceback)
