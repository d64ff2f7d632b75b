"""`@app.function`'s Function and FunctionCall: Python functions run remotely.

    app = App("demo")

    @app.function(cpu=1, memory="1Gi", retries=2, packages=["humanize"])
    def square(x):
        return x * x

    square(3)                       # runs here
    square.remote(3)                # runs in a sandbox -> 9
    list(square.map(range(10)))     # in input order
    call = square.spawn(4); call.get()
    with app.session():             # the calls in the block share one sandbox
        ...

Standard library only: a user's file that defines functions is imported inside containers too.
The calls themselves (grpc, cloudpickle) live in levers9.function_calls, imported when one is made;
it sees a Function through its own narrow RemoteFunction protocol, so it never imports this module.
Sessions (`with app.session():`) are levers9.function_sessions.
"""

from __future__ import annotations

import functools
import inspect
import re
import threading
from typing import Any, Callable, Iterable, Iterator

from levers9.function_sessions import Session as Session  # levers9.Session, app.session()
from levers9.options import PYTHON_PACKAGE_RE, ConfigError

MAX_RETRIES = 10


MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def function_options(retries: Any, packages: Any, generator: bool, shared_checkpoints: Any = True,
                     preload: Any = None) -> dict[str, Any]:
    """The spec's `function` section (levers9.contracts.spec.FunctionOptions), checked."""
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise ConfigError(f"retries {retries!r} is not valid: use a whole number from 0 to {MAX_RETRIES}, e.g. "
                          "retries=2 (attempts after the first)")
    if packages is None:
        packages = []
    if isinstance(packages, str) or not isinstance(packages, (list, tuple)):
        raise ConfigError(f"packages {packages!r} is not valid: use a list of pip requirements, e.g. "
                          "packages=['humanize==4.9.0']")
    for p in packages:
        if not isinstance(p, str) or not PYTHON_PACKAGE_RE.fullmatch(p.strip()) or len(p.strip()) > 400:
            raise ConfigError(f"packages item {p!r} is not valid: use a pip requirement like 'humanize==4.9.0' "
                              "on one line (pip options such as -r or --index-url are not allowed)")
    if not isinstance(shared_checkpoints, bool):
        raise ConfigError(f"shared_checkpoints {shared_checkpoints!r} is not valid: use True or False")
    options = {"retries": retries, "packages": [p.strip() for p in packages], "generator": generator}
    if not shared_checkpoints:  # only what was passed: the spec's default (True) applies otherwise
        options["shared_checkpoints"] = False
    if preload:
        if isinstance(preload, str) or not all(isinstance(m, str) and MODULE_RE.fullmatch(m) for m in preload):
            raise ConfigError(f"preload {preload!r} is not valid: use a list of module names, e.g. "
                              "preload=['numpy', 'pandas'] (imported when the sandbox starts)")
        options["preload"] = list(preload)
    return options


class Function:
    """A function of an App, callable here as it is and remotely with .remote/.map/.spawn/.remote_gen.

    `local` is the plain function (None for Function.lookup's); `spec` what `levers9 deploy` sends."""

    def __init__(self, local: Callable[..., Any] | None, app_name: str, name: str, spec: dict[str, Any],
                 generator: bool = False):
        self.local = local
        self.app_name = app_name
        self.name = name
        self.spec = spec
        self.is_generator = generator
        self._lock = threading.Lock()
        self._described: Any = None  # the DescribeReply of the first call
        self._imports: list[str] | None = None
        if local is not None:
            functools.update_wrapper(self, local)  # __wrapped__, __name__, __doc__, __module__, __qualname__

    def __getstate__(self) -> dict[str, Any]:  # a function that calls another pickles it by value
        state = dict(self.__dict__)
        state.pop("_lock", None)
        state["_described"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def label(self) -> str:
        return f"function {self.name} of app {self.app_name}"

    def __repr__(self) -> str:
        return f"Function({self.app_name!r}, {self.name!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here, in this process."""
        if self.local is None:
            raise TypeError(f"{self.label} was looked up: it runs remotely only: call .remote(...)")
        return self.local(*args, **kwargs)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Run it in a sandbox and return its value (or raise its exception, as its own type)."""
        from levers9 import function_calls

        self._not_generator("remote", "remote_gen")
        return function_calls.remote(self, args, kwargs)

    def map(self, iterable: Iterable[Any], *more: Iterable[Any], return_exceptions: bool = False,
            order_outputs: bool = True, kwargs: dict[str, Any] | None = None) -> Iterator[Any]:
        """func(a, b, ...) for each (a, b, ...) of zip(iterable, *more), like the builtin map, run in
        sandboxes concurrently; the values come in input order (as they finish if not order_outputs).
        The inputs are read lazily. The first failure raises (the rest are cancelled) unless
        return_exceptions, which yields the exception in its place."""
        fixed = dict(kwargs or {})
        return self._map(((tuple(a), fixed) for a in zip(iterable, *more, strict=False)),
                         return_exceptions, order_outputs)  # the shortest ends it, as map does

    def starmap(self, iterable: Iterable[Iterable[Any]], return_exceptions: bool = False,
                order_outputs: bool = True, kwargs: dict[str, Any] | None = None) -> Iterator[Any]:
        """Like map, each item being the arguments: func(*item)."""
        fixed = dict(kwargs or {})
        return self._map(((tuple(a), fixed) for a in iterable), return_exceptions, order_outputs)

    def _map(self, calls: Iterator[tuple[tuple[Any, ...], dict[str, Any]]], return_exceptions: bool,
             ordered: bool) -> Iterator[Any]:
        from levers9 import function_calls

        self._not_generator("map", "remote_gen")
        return function_calls.map_calls(self, calls, return_exceptions, ordered)

    def spawn(self, *args: Any, **kwargs: Any) -> "FunctionCall":
        """Start it in a sandbox and return at once; FunctionCall.get() waits for the value. The call
        runs on even if this process exits."""
        from levers9 import function_calls

        self._not_generator("spawn", "remote_gen")
        return FunctionCall(function_calls.spawn(self, args, kwargs))

    def remote_gen(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """Run a generator function in a sandbox; its items arrive as it yields them."""
        from levers9 import function_calls

        if not self.is_generator:
            raise TypeError(f"{self.label} is not a generator function: call .remote(...)")
        return function_calls.remote_gen(self, args, kwargs)

    def _not_generator(self, method: str, instead: str) -> None:
        if self.is_generator:
            raise TypeError(f"{self.label} is a generator function: .{method} cannot return its items: use "
                            f".{instead}(...)")

    @classmethod
    def lookup(cls, app: str, name: str) -> "Function":
        """A deployed function, by its app's and its own name; raises FunctionNotFoundError when it is
        not deployed."""
        from levers9 import function_calls

        fn = cls(None, app, name, {})
        reply = function_calls.ensure_described(fn, function_calls.function_ref(fn))
        fn.is_generator = bool(reply.generator)
        return fn


class FunctionCall:
    """A spawned call: `.id` names it (keep it to get the value from another process)."""

    def __init__(self, call_id: str):
        self.id = call_id

    def __repr__(self) -> str:
        return f"FunctionCall({self.id!r})"

    @classmethod
    def from_id(cls, call_id: str) -> "FunctionCall":
        return cls(call_id)

    def get(self, timeout: float | None = None) -> Any:
        """Wait for the value (or the exception); FunctionTimeoutError after `timeout` seconds, the
        call running on."""
        from levers9 import function_calls

        return function_calls.get(self.id, timeout)


def make_function(local: Callable[..., Any], app_name: str, spec: dict[str, Any]) -> Function:
    return Function(local, app_name, spec["name"], spec,
                    generator=inspect.isgeneratorfunction(local))
