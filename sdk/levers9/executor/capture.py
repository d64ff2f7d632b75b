"""A call's stdout and stderr, sent to its caller as they are written.

sys.stdout and sys.stderr are replaced once (install()) by routers. A write always goes to the
original stream (the container's log); when the writing thread belongs to a call, it also goes to
that call's sink, which queues `output` frames for the call's connection. A thread belongs to a
call when it is the call's thread or was started by one (Thread.start is wrapped to carry the sink
over; best effort: a thread pool made before the call keeps its threads unattributed). Two calls
have two sinks, so their writes never cross. Writes to sys.stdout.buffer or to the file descriptors
themselves (C extensions, subprocesses) reach only the log.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

_SINK_ATTR = "_levers9_sink"  # on a threading.Thread: the sink its writes go to
_installed = False


class Sink:
    """Where one call's writes go: `emit(fd, text)` until the call ends (closed)."""

    def __init__(self, emit: Callable[[int, str], None]):
        self.emit = emit
        self.lock = threading.Lock()  # a thread the call started may write while the call ends
        self.closed = False

    def write(self, fd: int, text: str) -> None:
        with self.lock:
            if not self.closed:
                self.emit(fd, text)

    def close(self) -> None:
        """After this nothing more is emitted: the call's answer may go out after its output."""
        with self.lock:
            self.closed = True


def current_sink() -> Sink | None:
    return getattr(threading.current_thread(), _SINK_ATTR, None)


@contextmanager
def capturing(sink: Sink) -> Iterator[None]:
    """The calling thread's writes go to sink too, within the block; the sink is closed after it."""
    thread = threading.current_thread()
    setattr(thread, _SINK_ATTR, sink)
    try:
        yield
    finally:
        setattr(thread, _SINK_ATTR, None)
        sink.close()


class Router:
    """Stands in for sys.stdout or sys.stderr; anything but writing is the original stream's."""

    def __init__(self, fd: int, original: Any):
        self._fd = fd
        self._original = original

    def write(self, text: str) -> int:
        written = self._original.write(text)
        sink = current_sink()
        if sink is not None and text:
            sink.write(self._fd, text)
        return written

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


def _start_with_sink(start: Callable[[threading.Thread], None]) -> Callable[[threading.Thread], None]:
    def start_carrying_sink(self: threading.Thread) -> None:
        sink = current_sink()
        if sink is not None:
            setattr(self, _SINK_ATTR, sink)
        start(self)
    return start_carrying_sink


def install() -> None:
    """Route sys.stdout and sys.stderr (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    sys.stdout = Router(1, sys.stdout)  # type: ignore[assignment]
    sys.stderr = Router(2, sys.stderr)  # type: ignore[assignment]
    threading.Thread.start = _start_with_sink(threading.Thread.start)  # type: ignore[method-assign,assignment]
