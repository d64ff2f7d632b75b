"""One call's parts that do not touch the connection: what the `call` frame asks for, loading the
function and its arguments, running it, and the `result` frame that answers it.

cloudpickle is imported on first use: the platform puts it beside this package on PYTHONPATH, and
the runner's other kinds never need it.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import os
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from levers9.executor.wire import ProtocolError

_HERE = os.path.dirname(os.path.abspath(__file__))
_IMPORT_HINT = "(add it to packages= or the image)"


class CallError(Exception):
    """The executor could not do what the call needs: load its function or its arguments, install its
    packages, or pickle what it returned. The message says which and why."""


@dataclass(frozen=True)
class CallRequest:
    """A `call` frame's header (wire.py)."""
    call_id: str
    function: dict[str, Any]
    session: str = ""
    generator: bool = False
    packages: list[str] = field(default_factory=list)
    timeout: float = 0.0
    json: bool = False  # a REST call: arguments and result are JSON, never pickles (json_arguments)

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> "CallRequest":
        function = header.get("function")
        if not isinstance(function, dict) or not (
                isinstance(function.get("pickled"), int)
                or (isinstance(function.get("module"), str) and isinstance(function.get("qualname"), str))):
            raise ProtocolError(f"the call's function is {function!r}: expected {{module, qualname}} or {{pickled: N}}")
        packages = header.get("packages") or []
        if not isinstance(packages, list) or not all(isinstance(p, str) for p in packages):
            raise ProtocolError(f"the call's packages are {packages!r}: expected a list of requirement strings")
        timeout = header.get("timeout") or 0
        if not isinstance(timeout, (int, float)) or timeout < 0:
            raise ProtocolError(f"the call's timeout is {timeout!r}: expected seconds (0: none)")
        return cls(call_id=str(header.get("call_id") or ""), function=function,
                   session=str(header.get("session") or ""), generator=bool(header.get("generator")),
                   packages=packages, timeout=float(timeout), json=bool(header.get("json")))


def cloudpickle() -> Any:
    import cloudpickle as module
    return module


# ---- loading ------------------------------------------------------------------------------------

def load_function(request: CallRequest, body: bytes) -> tuple[Any, bytes]:
    """The function to call and the rest of the body (its pickled arguments); CallError when the
    function cannot be unpickled or imported here."""
    spec = request.function
    if "pickled" in spec:
        size = spec["pickled"]
        if not 0 < size <= len(body):
            raise CallError(f"the call's body has {len(body)} bytes, fewer than the function's {size}")
        try:
            fn = cloudpickle().loads(body[:size])
        except Exception as exc:
            raise CallError(f"the function could not be unpickled in the sandbox: {_described(exc)}") from exc
        return _unwrapped(fn), body[size:]
    module_name, qualname = spec["module"], spec["qualname"]
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CallError(f"the function's module {module_name} could not be imported in the sandbox: "
                        f"{_described(exc)}") from exc
    try:
        fn = functools.reduce(getattr, qualname.split("."), module)
    except AttributeError:
        raise CallError(f"module {module_name} has no {qualname!r}: is the deployed code the one the caller "
                        "has?") from None
    fn = _unwrapped(fn)
    if not callable(fn):
        raise CallError(f"{module_name}.{qualname} is {type(fn).__name__}, not a function")
    return fn, body


def _unwrapped(fn: Any) -> Any:
    """What a wrapper object (levers9's Function: functools.update_wrapper) wraps: the sandbox runs
    the user's plain function, which a session can rebind. A wrapper *function* (a decorator's) is
    the user's code and runs as it is."""
    if not inspect.isroutine(fn) and callable(getattr(fn, "__wrapped__", None)):
        return fn.__wrapped__
    return fn


def load_arguments(raw: bytes) -> tuple[tuple[Any, ...], dict[str, Any]]:
    try:
        args, kwargs = cloudpickle().loads(raw) if raw else ((), {})
    except Exception as exc:
        raise CallError(f"the arguments could not be unpickled in the sandbox: {_described(exc)}") from exc
    return tuple(args), dict(kwargs)


def json_arguments(raw: bytes) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A REST call's `{"args": [...], "kwargs": {...}}` (the gateway checked its shape)."""
    import json

    try:
        data = json.loads(raw or b"{}")
        return tuple(data.get("args", ())), dict(data.get("kwargs", {}))
    except (ValueError, AttributeError, TypeError) as exc:
        raise CallError(f"the JSON arguments could not be read: {exc}") from exc


def json_result(value: Any) -> bytes:
    import json

    try:
        return json.dumps(value).encode()
    except (TypeError, ValueError) as exc:
        raise CallError(f"the return value ({type(value).__name__}) is not JSON, which a REST call needs: "
                        f"{exc}; call the function from Python, or return JSON-ready values") from exc


def _described(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return f"{text} {_IMPORT_HINT}" if isinstance(exc, ImportError) else text


# ---- running ------------------------------------------------------------------------------------

def run(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], generator: bool,
        send_item: Callable[[Any], None]) -> Any:
    """Call fn; a generator's (or async generator's) items go to send_item, and then it returns None.
    A coroutine runs on an event loop of its own, in this thread."""
    result = fn(*args, **kwargs)
    if inspect.isasyncgen(result):
        asyncio.run(_drain_async(result, send_item))
        return None
    if inspect.isawaitable(result):
        return asyncio.run(_awaited(result))
    if inspect.isgenerator(result) or (generator and result is not None):
        for item in result:
            send_item(item)
        return None
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


async def _drain_async(agen: Any, send_item: Callable[[Any], None]) -> None:
    async for item in agen:
        send_item(item)


def pickled(value: Any, what: str) -> bytes:
    try:
        return cloudpickle().dumps(value)
    except Exception as exc:
        raise CallError(f"{what} could not be pickled: {type(exc).__name__}: {exc}") from exc


# ---- answers ------------------------------------------------------------------------------------

@dataclass
class Outcome:
    """The `result` frame to send: its header and its body."""
    header: dict[str, Any]
    body: bytes = b""


def success(body: bytes) -> Outcome:
    return Outcome({"kind": "result", "ok": True}, body)


def failure(exc: BaseException) -> Outcome:
    """The exception the call raised: its type, message and traceback (from the user's first frame),
    and the exception itself pickled (empty when it cannot be)."""
    cls = type(exc)
    header = {"kind": "result", "ok": False, "error_type": f"{cls.__module__}.{cls.__qualname__}",
              "error": _text(exc), "traceback": "".join(traceback.format_exception(cls, exc, _user_frames(exc))),
              "reason": ""}
    try:
        body = cloudpickle().dumps(exc)
    except Exception:  # noqa: BLE001 - anything its __reduce__ raises: the header still says it all
        body = b""
    return Outcome(header, body)


def stopped(reason: str) -> Outcome:
    """A call the platform ended (cancelled, timed out) or could not run (the sandbox failed)."""
    return Outcome({"kind": "result", "ok": False, "error_type": "", "error": f"the call was stopped: {reason}",
                    "traceback": "", "reason": reason})


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the answer
        return f"<{type(exc).__name__} whose str() failed>"


def _user_frames(exc: BaseException) -> Any:
    """exc's traceback without the executor's own frames at its top: the caller sees its code."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == _HERE:
        tb = tb.tb_next
    return tb
