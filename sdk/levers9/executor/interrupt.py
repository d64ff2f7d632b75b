"""Stopping a call's thread from outside: a cancel frame, the timeout, or the caller going away.

Python has no way to kill a thread; CPython can raise an exception in one at its next bytecode
(PyThreadState_SetAsyncExc). The exception is CallCancelled, a BaseException so that the user's
`except Exception:` does not swallow it. Code blocked in C does not see it until it returns, so
time.sleep, the usual way a function waits, is replaced (install()) by a sleep that a stop wakes.

The guard raises at most once per call and only while the call's thread is armed (running user
code), so the executor's own bookkeeping (a slot, a lock) is never interrupted half-way; outside
that region the call's thread checks `reason` itself.

A pending exception is never cleared (PyThreadState_SetAsyncExc with NULL) nor left behind in a
thread that stops running Python: either leaves CPython 3.11's eval breaker set with no thread to
reset it, and then every function entry under a tracer (coverage, a debugger, Hypothesis) loops
for ever (seen: a test process stuck at 100% CPU). disarm lets it fire in the call's thread and
drops it there.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any, Callable


class CallCancelled(BaseException):
    """Raised inside a call's thread to stop it; never reaches the caller as such."""


_guards: dict[int, "Guard"] = {}  # thread id -> the guard of the call that thread runs, while armed
_original_sleep = time.sleep


class Guard:
    """One call's stop switch, shared by the call's thread and the thread watching its connection."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reason = ""  # why the call was stopped ("cancelled", "timed out after 2 s", ...); "" while not
        self.deadline: float | None = None  # time.monotonic() at which the call times out
        self.wake = threading.Event()  # set on stop: wakes the call's time.sleep
        self.thread_id: int | None = None  # the call's thread while armed
        self.hooks: list[Callable[[], None]] = []  # run on stop (kill a pip install)
        self.sent = False  # CallCancelled was made pending in the call's thread (delivered by disarm at last)

    def stop(self, reason: str) -> bool:
        """Stop the call (the first reason wins); False when it was already stopped."""
        with self.lock:
            if self.reason:
                return False
            self.reason = reason
            if self.thread_id is not None:
                _set_async_exc(self.thread_id, CallCancelled)
                self.sent = True
            hooks = list(self.hooks)
        self.wake.set()
        for hook in hooks:
            hook()
        return True

    def on_stop(self, hook: Callable[[], None]) -> None:
        with self.lock:
            self.hooks.append(hook)
            stopped = bool(self.reason)
        if stopped:
            hook()

    def arm(self, timeout: float) -> None:
        """From here on (in the calling thread) a stop raises CallCancelled; the timeout starts now."""
        with self.lock:
            if self.reason:
                raise CallCancelled(self.reason)
            self.thread_id = threading.get_ident()
            self.deadline = time.monotonic() + timeout if timeout > 0 else None
            _guards[self.thread_id] = self

    def disarm(self) -> None:
        """No exception is raised in the call's thread after this; one still pending fires here and
        is dropped (call it in the call's thread).

        A pending CallCancelled may still fire on the way in, before the lock is taken: the caller
        catches it (there is never a second one, stop raises once)."""
        with self.lock:
            thread_id, self.thread_id = self.thread_id, None
            if thread_id is not None:
                _guards.pop(thread_id, None)
            sent, self.sent = self.sent, False
        if sent:
            _deliver_pending()


def _set_async_exc(thread_id: int, exc_type: type[BaseException]) -> None:
    """Make exc_type pending in that thread: it fires at that thread's next eval-breaker check."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc_type))


def _tick() -> None:
    """A function entry: the interpreter checks its eval breaker there."""


def _deliver_pending() -> None:
    """Let this thread's pending CallCancelled (if it has not fired yet) fire here, and drop it."""
    try:
        for _ in range(8):
            _tick()
    except CallCancelled:
        pass


def sleep(seconds: Any) -> None:
    """time.sleep, except that in a call's thread a stop of the call ends it at once."""
    guard = _guards.get(threading.get_ident())
    if guard is None or not isinstance(seconds, (int, float)) or not seconds > 0:
        return _original_sleep(seconds)  # its own checks and errors for odd arguments
    deadline = time.monotonic() + seconds
    if guard.wake.wait(seconds):
        # stopped: CallCancelled is pending in this thread and fires at the next bytecode; should it
        # not (the guard was disarmed meanwhile), sleep what is left
        left = deadline - time.monotonic()
        if left > 0:
            _original_sleep(left)
    return None


def install() -> None:
    """Replace time.sleep for the whole process (other threads get the original behaviour)."""
    time.sleep = sleep
