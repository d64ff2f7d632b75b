"""The executor's socket: one connection per call, one thread per connection.

A connection gets the hello first, then brings a `call` (or a `ping`). The connection's thread runs
the call itself; beside it a sender thread writes the frames the call produces (output, items, the
result) in the order they were queued, and a watcher thread reads the connection for a `cancel`
frame or its closing, and enforces the timeout. The runner's state is the host's: calls wait for
it to be ready, take one of its concurrency slots, and count in its status (inflight, requests,
last_request_at), which the worker reads for keep-warm and idle decisions.
"""

from __future__ import annotations

import os
import queue
import select
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Protocol

from levers9.executor import capture, interrupt, packages, sandbox_ops, wire
from levers9.executor.calls import (
    CallError,
    CallRequest,
    Outcome,
    failure,
    json_arguments,
    json_result,
    load_arguments,
    load_function,
    pickled,
    run,
    stopped,
    success,
)
from levers9.executor.interrupt import CallCancelled, Guard
from levers9.executor.reseed import reseed
from levers9.executor.sessions import Sessions

POLL_S = 0.1  # how often waiting threads look at a stop, and the accept loop at the socket file
CALLER_GONE = "the caller went away"
LINGER_S = 0.02  # how long an unfinished line waits for the rest before it goes out
MAX_TEXT = 64 * 1024  # characters per output frame: the header stays well under wire.MAX_HEADER
_CLOSE = object()


class Host(Protocol):
    """What the executor needs of the runner's Runtime."""
    slots: threading.BoundedSemaphore
    loaded: threading.Event
    state: str
    error: str

    def begin(self) -> None: ...

    def end(self) -> None: ...

    def status(self) -> dict[str, Any]: ...


def log(line: str) -> None:
    sys.stdout.write(f"levers9 executor: {line}\n")
    sys.stdout.flush()


class Channel:
    """A connection's sending side. Any thread queues (a SimpleQueue put is one C call, so a
    CallCancelled cannot leave it half done); one sender thread writes, joining queued output of one
    stream into one frame. Once the connection fails, frames are dropped."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.broken = False
        self.thread = threading.Thread(target=self._send_all, name="levers9-send", daemon=True)
        self.thread.start()

    def send(self, header: dict[str, Any], body: bytes = b"") -> None:
        self.queue.put(("frame", header, body))

    def output(self, fd: int, text: str) -> None:
        self.queue.put(("output", fd, text))

    def close(self, timeout: float = 30.0) -> None:
        """Send what is queued, then stop the sender."""
        self.queue.put(_CLOSE)
        self.thread.join(timeout)

    def _send_all(self) -> None:
        pending: Any = None
        while True:
            item, pending = (pending if pending is not None else self.queue.get()), None
            if item is _CLOSE:
                return
            if item[0] == "frame":
                self._write(item[1], item[2])
                continue
            fd, parts = item[1], [item[2]]
            while sum(map(len, parts)) < MAX_TEXT:  # what is already queued goes in the same frame
                try:
                    # print() writes the text and its newline apart: wait a moment for the line's end
                    nxt = self.queue.get(timeout=LINGER_S) if not parts[-1].endswith("\n") else self.queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _CLOSE or nxt[0] != "output" or nxt[1] != fd:
                    pending = nxt
                    break
                parts.append(nxt[2])
            text = "".join(parts)
            for start in range(0, len(text), MAX_TEXT):
                self._write({"kind": "output", "fd": fd, "text": text[start:start + MAX_TEXT]})

    def _write(self, header: dict[str, Any], body: bytes = b"") -> None:
        if self.broken:
            return
        try:
            wire.send_frame(self.sock, header, body)
        except OSError:
            self.broken = True


class ExecutorServer:
    def __init__(self, socket_path: str, packages_dir: str, host: Host, default_timeout: float = 0.0):
        self.path = Path(socket_path)
        self.packages_dir = Path(packages_dir)
        self.host = host
        self.default_timeout = default_timeout  # the runner's LEVERS9_RUNNER_TIMEOUT, for calls without one
        self.sessions = Sessions()
        self.execs = sandbox_ops.Execs()  # a sandbox's running programs (sandbox_ops)
        self.stopping = threading.Event()
        self.listener: socket.socket | None = None
        self.inode = 0

    # -- the socket --

    def listen(self) -> None:
        """Route stdout/stderr and time.sleep for calls, then bind the socket (OSError if it cannot)."""
        capture.install()
        interrupt.install()
        self._bind()

    def _bind(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.path.unlink()  # a stale socket of an earlier process
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        os.chmod(self.path, 0o666)  # the worker's relay may run as another user than the sandbox
        listener.listen(128)
        listener.settimeout(POLL_S * 5)
        old, self.listener, self.inode = self.listener, listener, os.stat(self.path).st_ino
        if old is not None:
            old.close()

    def _rebind_if_gone(self) -> None:
        """Bind again when the socket file disappeared or was replaced: a sandbox restored from a
        checkpoint gets a fresh socket directory from the worker."""
        try:
            if os.stat(self.path).st_ino == self.inode:
                return
        except FileNotFoundError:
            pass
        try:
            self._bind()
            # a new socket directory means this process was restored from a checkpoint
            log(f"listening again on {self.path} (restored: reseeded {', '.join(reseed())})")
        except OSError as exc:
            log(f"cannot listen on {self.path} again: {exc}")

    def serve_forever(self) -> None:
        log(f"listening on {self.path}")
        while not self.stopping.is_set():
            self._rebind_if_gone()
            listener = self.listener
            if listener is None:
                return
            try:
                conn, _ = listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                if self.stopping.is_set():
                    return
                time.sleep(POLL_S)
                continue
            conn.setblocking(True)
            threading.Thread(target=self._serve, args=(conn,), name="levers9-call", daemon=True).start()

    def stop(self) -> None:
        """No new connections (the calls in flight go on); the socket file is removed."""
        self.stopping.set()
        if self.listener is not None:
            self.listener.close()
        try:
            if os.stat(self.path).st_ino == self.inode:
                self.path.unlink()
        except OSError:
            pass

    # -- one connection --

    def _serve(self, sock: socket.socket) -> None:
        with sock:
            try:
                wire.send_frame(sock, {"kind": "hello", "generation": wire.GENERATION,
                                       "python": "%d.%d" % sys.version_info[:2], "pid": os.getpid()})
                header, body = wire.read_frame(sock)
                if header["kind"] == "ping":
                    return wire.send_frame(sock, self._pong())
                if header["kind"] in sandbox_ops.KINDS:  # a sandbox's exec, stdin or file request
                    return sandbox_ops.serve(sock, header, body, self.host, self.execs)
                if header["kind"] != "call":
                    raise wire.ProtocolError(f"expected a call or a ping, got {header['kind']!r}")
                request = CallRequest.from_header(header)
            except wire.ProtocolError as exc:
                return self._refuse(sock, exc)
            except OSError:
                return  # the caller went away before its call
            try:
                self._call(sock, request, body)
            except Exception:  # noqa: BLE001 - a bug here must not end the accept loop; it is logged
                log(f"call {request.call_id} failed in the executor:\n{traceback.format_exc()}")

    def _refuse(self, sock: socket.socket, exc: Exception) -> None:
        try:
            wire.send_frame(sock, stopped(f"protocol error: {exc}").header)
        except OSError:
            pass

    def _pong(self) -> dict[str, Any]:
        status = self.host.status()
        return {"kind": "pong", "state": status["state"], "inflight": status["inflight"]}

    def _call(self, sock: socket.socket, request: CallRequest, body: bytes) -> None:
        guard, channel, done = Guard(), Channel(sock), threading.Event()
        # the watcher polls this pipe beside the socket: a byte in it ends the watch at once (waiting
        # for its poll's timeout held every call's connection, hence the relay's, POLL_S longer)
        wake_r, wake_w = os.pipe()
        watcher = threading.Thread(target=self._watch, args=(sock, guard, channel, done, request, wake_r),
                                   name="levers9-watch", daemon=True)
        watcher.start()
        started = time.monotonic()
        try:
            outcome = self._run_in_slot(request, body, guard, channel)
        finally:
            done.set()
            os.write(wake_w, b"x")
        gone = guard.reason == CALLER_GONE
        if not gone:
            channel.send(outcome.header, outcome.body)
        channel.close()
        watcher.join(POLL_S * 5)
        os.close(wake_r)
        os.close(wake_w)
        how = "ok" if outcome.header["ok"] else (outcome.header["reason"] or outcome.header["error_type"])
        log(f"call {request.call_id or '-'} {CALLER_GONE if gone else how} {1000 * (time.monotonic() - started):.1f}ms")

    def _watch(self, sock: socket.socket, guard: Guard, channel: Channel, done: threading.Event,
               request: CallRequest, wake: int) -> None:
        """Until the call is done (`wake` becomes readable then): a cancel frame, the connection
        closing, or the deadline stops it."""
        poller = select.poll()  # not select.select: a descriptor over FD_SETSIZE would break it
        poller.register(sock, select.POLLIN)
        poller.register(wake, select.POLLIN)
        while not done.is_set():
            if guard.deadline is not None and time.monotonic() >= guard.deadline:
                guard.stop(self._cancel_reason({"reason": "timeout"}, request))
            try:
                ready = poller.poll(POLL_S * 1000)
                if not ready or any(fd == wake for fd, _ in ready):
                    continue  # the deadline, or done: the loop looks again
                header, _ = wire.read_frame(sock)
            except (wire.ProtocolError, OSError, ValueError):
                if not done.is_set():  # (a caller that closes once it has the result is not gone early)
                    guard.stop(CALLER_GONE)  # also a broken frame: the caller's side is not usable
                return
            if header["kind"] == "cancel":
                guard.stop(self._cancel_reason(header, request))
            elif header["kind"] == "ping":
                channel.send(self._pong())
            else:
                log(f"call {request.call_id}: ignoring a {header['kind']!r} frame during the call")

    def _cancel_reason(self, header: dict[str, Any], request: CallRequest) -> str:
        """"cancelled", or the timeout's reason when the caller's own deadline sent the cancel."""
        said = str(header.get("reason") or "")
        if "timeout" not in said and "timed out" not in said:
            return "cancelled"
        timeout = request.timeout or self.default_timeout
        return f"timed out after {timeout:g} s" if timeout else "timed out"

    def _run_in_slot(self, request: CallRequest, body: bytes, guard: Guard, channel: Channel) -> Outcome:
        """Wait for the runner to be ready and for a slot (giving up when stopped), then run the call."""
        host = self.host
        while not host.loaded.wait(POLL_S):
            if guard.reason:
                return stopped(guard.reason)
        if host.state == "failed":
            return stopped(f"the sandbox failed to start: {host.error}")
        while not host.slots.acquire(timeout=POLL_S):
            if guard.reason:
                return stopped(guard.reason)
        host.begin()
        try:
            return self._execute(request, body, guard, channel)
        finally:
            host.slots.release()
            host.end()

    def _execute(self, request: CallRequest, body: bytes, guard: Guard, channel: Channel) -> Outcome:
        try:
            self._install(request.packages, guard, channel)
        except (packages.InstallFailed, OSError) as exc:
            if guard.reason:
                return stopped(guard.reason)
            detail = str(exc) if isinstance(exc, packages.InstallFailed) else f"{type(exc).__name__}: {exc}"
            return failure(CallError(f"installing packages failed: {detail}"))
        # Only this region runs user code, and only here can the guard raise CallCancelled in this
        # thread; it may fire anywhere inside, the disarm included, and is caught right below.
        try:
            try:
                guard.arm(request.timeout or self.default_timeout)
                outcome = self._invoke(request, body, channel)
            finally:
                guard.disarm()
        except CallCancelled:
            outcome = stopped(guard.reason or "cancelled")
        return outcome

    def _invoke(self, request: CallRequest, body: bytes, channel: Channel) -> Outcome:
        def send_item(item: Any) -> None:
            channel.send({"kind": "item"}, pickled(item, "a yielded item"))

        try:
            # unpickling runs user code too (the imports of the function's module): its prints count
            with capture.capturing(capture.Sink(channel.output)):
                fn, rest = load_function(request, body)
                if "pickled" in request.function:
                    fn = self.sessions.bind(fn, request.session)
                args, kwargs = json_arguments(rest) if request.json else load_arguments(rest)
                value = run(fn, args, kwargs, request.generator, send_item)
            return success(json_result(value) if request.json else pickled(value, "the return value"))
        except CallCancelled:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit from user code is its result too
            return failure(exc)

    def _install(self, requirements: list[str], guard: Guard, channel: Channel) -> None:
        """pip installs for the call, its output streamed as the call's stderr (and to the log)."""
        if not requirements:
            return

        def emit(line: str) -> None:
            sys.stderr.write(line)
            channel.output(2, line)

        packages.ensure(requirements, self.packages_dir, emit, lambda proc: guard.on_stop(proc.kill),
                        lambda: bool(guard.reason))
