"""The runner's state and the user's code: importing the module, running on_start, and calling the
endpoint function within the concurrency limit and the deadline.

Threads: one runs an asyncio loop for async handlers, ASGI apps and async on_start; sync handlers
run in a thread of their own so a deadline can answer 504 while they go on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import inspect
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from levers9.runner.config import Config


@dataclass
class Context:
    """What an endpoint function receives as `context` when it has a parameter of that name."""
    on_start_value: Any = None
    request_id: str = ""
    path: str = ""
    method: str = ""
    headers: dict[str, str] = field(default_factory=dict)


class DeadlineExceeded(Exception):
    pass


class LoadError(Exception):
    pass


def log(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def print_exception(exc: BaseException) -> None:
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    sys.stderr.flush()


def error_body(exc: BaseException) -> dict[str, str]:
    return {"error": f"{type(exc).__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))}


class Runtime:
    def __init__(self, config: Config):
        self.config = config
        self.state = "starting"  # starting | ready | failed | stopping
        self.error = ""
        self.lock = threading.RLock()  # a signal handler may take it in the main thread
        self.inflight = 0
        self.requests = 0
        self.last_request_at: float | None = None
        self.on_start_seconds: float | None = None
        self.on_start_value: Any = None
        self.target: Any = None  # the endpoint function, or the ASGI app
        self.wants_context = False
        self.loaded = threading.Event()  # set once ready or failed
        self.finished = threading.Event()  # set when the process should end (stop requested, or failed)
        self.slots = threading.BoundedSemaphore(config.concurrency)
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, name="levers9-loop", daemon=True)
        self.loop_thread.start()
        self.calls: set[threading.Thread] = set()  # sync handlers running (a 504 does not stop them)

    # -- loading --

    def load(self) -> None:
        """Import the module, run on_start, find the handler; on any failure: failed, exit 3."""
        cfg = self.config
        try:
            self.load_target()
        except BaseException as exc:  # noqa: BLE001 - SystemExit from module code included: state failed, exit 3
            traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
            with self.lock:
                self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            self.loaded.set()
            self.finished.set()
            return
        trim_heap()
        with self.lock:
            if self.state == "starting":
                self.state = "ready"
        if cfg.kind == "function":
            log(f"ready: function sandbox{' of ' + cfg.module if cfg.module else ''}; loading took "
                f"{self.on_start_seconds:.3f}s")
        else:
            log(f"ready: {cfg.module}.{cfg.handler} ({cfg.kind}); on_start took {self.on_start_seconds:.3f}s")
        self.loaded.set()

    def load_target(self) -> None:
        cfg = self.config
        if cfg.app_dir not in sys.path:
            sys.path.insert(0, cfg.app_dir)
        if cfg.kind == "function":
            return self.load_functions()
        module = importlib.import_module(cfg.module)
        started = time.monotonic()
        if cfg.on_start:
            on_start = getattr(module, cfg.on_start, None)
            if not callable(on_start):
                raise LoadError(f"module {cfg.module} has no function {cfg.on_start!r} (LEVERS9_RUNNER_ON_START)")
            self.on_start_value = self.run(on_start)
        self.on_start_seconds = round(time.monotonic() - started, 6)
        obj = getattr(module, cfg.handler, None)
        if obj is None:
            raise LoadError(f"module {cfg.module} has no attribute {cfg.handler!r} (LEVERS9_RUNNER_HANDLER)")
        if cfg.kind == "asgi":
            self.target = self.asgi_app(obj)
        else:
            if not callable(obj):
                raise LoadError(f"{cfg.module}.{cfg.handler} is not a function")
            self.target = obj
            self.wants_context = "context" in inspect.signature(obj).parameters

    def load_functions(self) -> None:
        """A function sandbox: the deployed module (when there is one) with its function, then the
        modules to have imported before the first call; those are a speed-up, so one that fails to
        import is logged and the sandbox goes on (the call that needs it reports the error)."""
        cfg = self.config
        started = time.monotonic()
        if cfg.module:
            module = importlib.import_module(cfg.module)
            if cfg.handler and getattr(module, cfg.handler, None) is None:
                raise LoadError(f"module {cfg.module} has no attribute {cfg.handler!r} (LEVERS9_RUNNER_HANDLER)")
        for name in cfg.imports:
            try:
                importlib.import_module(name)
            except BaseException as exc:  # noqa: BLE001 - SystemExit from module code too: not fatal here
                log(f"LEVERS9_RUNNER_IMPORTS: {name} could not be imported: {type(exc).__name__}: {exc}")
        self.on_start_seconds = round(time.monotonic() - started, 6)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call fn; when it is async (or returns an awaitable) await it on the loop."""
        result = fn(*args)
        if inspect.isawaitable(result):
            return asyncio.run_coroutine_threadsafe(awaited(result), self.loop).result()
        return result

    def asgi_app(self, obj: Any) -> Any:
        """The ASGI app itself (an async callable), or what a factory function returns."""
        if is_asgi(obj):
            return obj
        if not (inspect.isfunction(obj) or inspect.ismethod(obj)):
            raise LoadError(f"{self.config.handler} is neither an ASGI app nor a function that returns one")
        params = inspect.signature(obj).parameters
        app = self.run(obj, Context(on_start_value=self.on_start_value)) if "context" in params else self.run(obj)
        if not callable(app):
            raise LoadError(f"{self.config.handler}() returned {app!r}, not an ASGI app")
        return app

    # -- bookkeeping --

    def begin(self) -> None:
        with self.lock:
            self.inflight += 1
            self.requests += 1
            self.last_request_at = time.time()

    def end(self) -> None:
        with self.lock:
            self.inflight -= 1
            self.last_request_at = time.time()

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {"state": self.state, "inflight": self.inflight, "requests": self.requests,
                    "last_request_at": self.last_request_at, "on_start_seconds": self.on_start_seconds}

    def request_stop(self) -> None:
        with self.lock:
            if self.state != "failed":
                self.state = "stopping"
        self.finished.set()

    # -- calling the user's code --

    def call(self, kwargs: dict[str, Any]) -> concurrent.futures.Future:
        """Start the endpoint function with a concurrency slot; the slot is freed when it really ends."""
        fn, timeout = self.target, self.config.timeout or None
        self.slots.acquire()
        if inspect.iscoroutinefunction(fn):
            async def run_async() -> Any:
                try:
                    return await with_deadline(fn(**kwargs), timeout)
                finally:
                    self.slots.release()
            return asyncio.run_coroutine_threadsafe(run_async(), self.loop)

        future: concurrent.futures.Future = concurrent.futures.Future()

        def run_sync() -> None:
            try:
                result = fn(**kwargs)
                if inspect.isawaitable(result):
                    result = asyncio.run_coroutine_threadsafe(awaited(result), self.loop).result()
                future.set_result(result)
            except BaseException as exc:  # noqa: BLE001 - the future carries it to the request: 500, printed
                future.set_exception(exc)
            finally:
                self.slots.release()
                with self.lock:
                    self.calls.discard(threading.current_thread())

        thread = threading.Thread(target=run_sync, name="levers9-call", daemon=True)
        with self.lock:
            self.calls.add(thread)
        thread.start()
        return future


async def awaited(awaitable: Any) -> Any:
    return await awaitable


async def with_deadline(awaitable: Any, timeout: float | None) -> Any:
    try:
        async with asyncio.timeout(timeout) as deadline:
            return await awaitable
    except TimeoutError:
        if deadline.expired():
            raise DeadlineExceeded(f"the request did not finish within {timeout:g} s") from None
        raise


def is_asgi(obj: Any) -> bool:
    if inspect.iscoroutinefunction(obj):
        return True
    if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isclass(obj):
        return False
    return callable(obj) and inspect.iscoroutinefunction(obj.__call__)


def trim_heap() -> None:
    """Give freed heap pages back to the kernel once on_start is done: a checkpoint of this process
    (taken right after it reports ready) then holds only what the app still uses (~40% smaller for
    a pandas app that built and dropped temporaries)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
