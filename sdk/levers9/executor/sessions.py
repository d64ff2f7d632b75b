"""Sessions: the calls of one session share their module's globals, like a notebook's kernel.

cloudpickle gives every function it unpickles by value a fresh globals dict holding only what the
function refers to, so `global counter; counter += 1` would start from the pickled value on every
call. A session keeps one dict instead: each call's function is rebuilt on it, after the names the
session does not have yet are copied in (what the session already holds wins: that is the state).
Module-level helpers that came in the same pickle (they share the function's fresh dict) are
rebuilt on the session's dict too, once, when they first arrive, so they see the same state.

Deployed functions (imported by module and qualname) already share their module's globals with
every call of the sandbox; sessions do not change them. Classes pickled by value keep their
methods' fresh globals (best effort).
"""

from __future__ import annotations

import threading
import types
from typing import Any


class Sessions:
    def __init__(self) -> None:
        self.lock = threading.Lock()  # two calls of one session may arrive at once
        self.globals: dict[str, dict[str, Any]] = {}

    def bind(self, fn: Any, session: str) -> Any:
        """fn itself without a session or when it is not a plain function; else fn on the session's globals."""
        if not session or not isinstance(fn, types.FunctionType):
            return fn
        with self.lock:
            shared = self.globals.setdefault(session, {})
            return adopt(fn, shared)

    def forget(self, session: str) -> None:
        with self.lock:
            self.globals.pop(session, None)


def adopt(fn: types.FunctionType, shared: dict[str, Any]) -> types.FunctionType:
    """fn rebuilt on shared, after shared took the names of fn's globals it lacked; the functions
    among them that came from fn's pickle are rebuilt on shared as well."""
    fresh = fn.__globals__
    if fresh is shared:
        return fn
    for name, value in fresh.items():
        shared.setdefault(name, value)
    rebuilt: dict[int, types.FunctionType] = {}
    for name, value in list(shared.items()):
        if isinstance(value, types.FunctionType) and value.__globals__ is fresh:
            shared[name] = rebuilt.setdefault(id(value), rebind(value, shared))
    return rebuilt.get(id(fn)) or rebind(fn, shared)


def rebind(fn: types.FunctionType, globals_: dict[str, Any]) -> types.FunctionType:
    """A copy of fn whose globals are globals_ (code, defaults, closure and attributes kept)."""
    new = types.FunctionType(fn.__code__, globals_, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__annotations__ = dict(fn.__annotations__)
    return new
