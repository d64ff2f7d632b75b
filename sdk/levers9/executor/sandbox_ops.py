"""The sandbox agent: what the executor does for a sandbox (exec, stdin, files), inside its container.

One request per connection of the executor's socket (after its hello), as wire frames:

    exec        {argv, env, workdir} -> started {exec_id, pid}; then stream {fd: 1|2} with the bytes as
                the program writes them; then exit {code}. A program that cannot start: its error on
                stream fd 2 and exit {code: 127} (126 when it is no executable). The caller may go
                away: the program runs on, its output read and dropped (a full pipe never stalls it).
    stdin       {exec_id, close} body = bytes -> ok {}   written to the program's stdin (then closed)
    file-write  {root, path} body = bytes -> ok {size}
    file-read   {root, path} -> ok {size} body = bytes
    file-ls     {root, path} -> ok {entries: [{name, type, size}]}
    file-rm     {root, path, recursive} -> ok {}
    any refusal -> error {status, error}   (status: the HTTP status the gateway answers)

Each is tenant input run here, inside the container, never on the host. Paths are confined by
sandbox_rules (the workdir is the root; symbolic links are judged by where they lead). Every op
counts in the runner's status (inflight, last_request_at), which the worker's keep-warm reads: that
is the sandbox's idle timeout.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import stat
import subprocess
import threading
from typing import Any, Protocol

from levers9.executor import wire
from levers9.executor.sandbox_rules import (
    TIMED_OUT_CODE,
    Refused,
    check_argv,
    check_exec_timeout,
    check_size,
    confine,
    exit_code,
    resolved_inside,
    spawn_failure,
)

KINDS = frozenset({"exec", "stdin", "file-write", "file-read", "file-ls", "file-rm"})
CHUNK = 1 << 16
DEFAULT_ROOT = "/sandbox"
PIPE_GRACE_S = 0.5
ENDED_KEPT = 256  # after the program exited, how long its pipes may stay open (a child it left behind)


class Host(Protocol):
    def begin(self) -> None: ...

    def end(self) -> None: ...


class Execs:
    """The programs started by exec, by id, while they run (stdin finds them here)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.ended: dict[str, int] = {}  # the latest ENDED_KEPT execs that ended, and their exit codes
        self.ids = itertools.count(1)

    def add(self, proc: subprocess.Popen[bytes]) -> str:
        exec_id = f"{os.getpid()}-{next(self.ids)}-{proc.pid}"
        with self.lock:
            self.running[exec_id] = proc
        return exec_id

    def get(self, exec_id: str) -> subprocess.Popen[bytes]:
        with self.lock:
            proc = self.running.get(exec_id)
            code = self.ended.get(exec_id)
        if code is not None:
            raise Refused(409, f"exec {exec_id} has ended (exit code {code}): its stdin is closed")
        if proc is None:
            raise Refused(404, f"no exec {exec_id!r} in this sandbox")
        return proc

    def drop(self, exec_id: str, code: int) -> None:
        with self.lock:
            self.running.pop(exec_id, None)
            self.ended[exec_id] = code
            while len(self.ended) > ENDED_KEPT:
                self.ended.pop(next(iter(self.ended)))


class Sender:
    """Frames to the caller from several threads; once the caller is gone, frames are dropped."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.lock, self.broken = sock, threading.Lock(), False

    def send(self, header: dict[str, Any], body: bytes = b"") -> None:
        with self.lock:
            if self.broken:
                return
            try:
                wire.send_frame(self.sock, header, body)
            except OSError:
                self.broken = True


def serve(sock: socket.socket, header: dict[str, Any], body: bytes, host: Host, execs: Execs) -> None:
    """Answer one sandbox request on `sock` (its connection); refusals are `error` frames."""
    host.begin()
    try:
        kind = header["kind"]
        if kind == "exec":
            return run_exec(Sender(sock), header, execs)
        answer, data = (write_stdin(header, body, execs) if kind == "stdin" else file_op(kind, header, body))
        wire.send_frame(sock, {"kind": "ok", **answer}, data)
    except Refused as exc:
        _send_quietly(sock, {"kind": "error", "status": exc.status, "error": str(exc)})
    except OSError as exc:
        _send_quietly(sock, {"kind": "error", **os_refusal(exc, str(header.get("path", "")))})
    except Exception as exc:  # noqa: BLE001 - a bug here answers with what it was, never a bare reset
        _send_quietly(sock, {"kind": "error", "status": 500, "error": f"the sandbox's agent failed: "
                                                                      f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        host.end()


def _send_quietly(sock: socket.socket, header: dict[str, Any]) -> None:
    try:
        wire.send_frame(sock, header)
    except OSError:
        pass


def os_refusal(exc: OSError, path: str) -> dict[str, Any]:
    """An OSError of a file op as the status and sentence the caller gets."""
    statuses = {2: 404, 20: 400, 21: 400, 13: 403, 1: 403, 39: 409, 17: 409, 28: 507, 36: 400, 40: 403}
    what = exc.strerror or type(exc).__name__
    return {"status": statuses.get(exc.errno or 0, 500), "error": f"{path[:200]}: {what}"}


# ---- exec -----------------------------------------------------------------------------------------

def run_exec(out: Sender, header: dict[str, Any], execs: Execs) -> None:
    argv = check_argv(header.get("argv"))
    timeout = check_exec_timeout(header.get("timeout"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **{str(k): str(v) for k, v in (header.get("env") or {}).items()}}
    workdir = str(header.get("workdir") or header.get("root") or DEFAULT_ROOT)
    os.makedirs(workdir, exist_ok=True)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=workdir, env=env, start_new_session=True)
    except OSError as exc:
        code, line = spawn_failure(argv[0], exc)
        out.send({"kind": "started", "exec_id": "", "pid": 0})
        out.send({"kind": "stream", "fd": 2}, line.encode())
        out.send({"kind": "exit", "code": code})
        return
    exec_id = execs.add(proc)
    out.send({"kind": "started", "exec_id": exec_id, "pid": proc.pid})
    pumps = [threading.Thread(target=pump, args=(pipe, fd, out), daemon=True, name=f"levers9-exec-{fd}")
             for fd, pipe in ((1, proc.stdout), (2, proc.stderr))]
    for t in pumps:
        t.start()
    timed_out = False
    try:
        code = exit_code(proc.wait(timeout))
    except subprocess.TimeoutExpired:  # the program and whatever it started (its own session)
        timed_out, code = True, TIMED_OUT_CODE
        _kill_session(proc)
    for t in pumps:
        t.join(PIPE_GRACE_S)
    execs.drop(exec_id, code)
    if timed_out:
        out.send({"kind": "stream", "fd": 2}, f"levers9: {argv[0]} ran past its timeout of {timeout:g} s and was "
                                                "killed\n".encode())
    out.send({"kind": "exit", "code": code, **({"timed_out": True} if timed_out else {})})


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def pump(pipe: Any, fd: int, out: Sender) -> None:
    """The program's output to the caller as it comes (read whatever is there, up to CHUNK)."""
    try:
        while chunk := os.read(pipe.fileno(), CHUNK):
            out.send({"kind": "stream", "fd": fd}, chunk)
    except OSError:
        pass
    finally:
        pipe.close()


def write_stdin(header: dict[str, Any], body: bytes, execs: Execs) -> tuple[dict[str, Any], bytes]:
    try:
        proc = execs.get(str(header.get("exec_id", "")))
    except Refused as exc:
        if exc.status == 409 and header.get("close") and not body:  # closing what already ended: done
            return {"written": 0}, b""
        raise
    assert proc.stdin is not None
    try:
        if body:
            proc.stdin.write(body)
            proc.stdin.flush()
        if header.get("close"):
            proc.stdin.close()
    except (BrokenPipeError, ValueError):
        raise Refused(409, "the program's stdin is closed (it closed it, it ended, or stdin was closed before)") \
            from None
    return {"written": len(body)}, b""


# ---- files ----------------------------------------------------------------------------------------

def file_op(kind: str, header: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
    root = str(header.get("root") or DEFAULT_ROOT)
    asked = str(header.get("path", ""))
    path = confine(root, asked)
    os.makedirs(root, exist_ok=True)
    real_root = os.path.realpath(root)
    if kind == "file-rm":  # the entry itself (a link is removed, never what it points to)
        parent = os.path.realpath(os.path.dirname(path))
        resolved_inside(real_root, parent, asked)
        return remove(os.path.join(parent, os.path.basename(path)), bool(header.get("recursive")), real_root)
    real = os.path.realpath(path)
    resolved_inside(real_root, real, asked)
    if kind == "file-write":
        check_size(len(body))
        os.makedirs(os.path.dirname(real), exist_ok=True)
        with open(real, "wb") as f:
            f.write(body)
        return {"size": len(body)}, b""
    if kind == "file-read":
        info = os.stat(real)
        if stat.S_ISDIR(info.st_mode):
            raise Refused(400, f"{asked[:200]} is a directory: list it with ls")
        check_size(info.st_size)
        with open(real, "rb") as f:
            data = f.read(info.st_size + 1)
        check_size(len(data))
        return {"size": len(data)}, data
    return {"entries": listing(real)}, b""


def listing(path: str) -> list[dict[str, Any]]:
    """A directory's entries (a file lists itself), sorted by name."""
    if not os.path.isdir(path):
        info = os.lstat(path)
        return [entry(os.path.basename(path), info)]
    out = []
    with os.scandir(path) as it:
        for e in it:
            try:
                out.append(entry(e.name, e.stat(follow_symlinks=False)))
            except OSError:
                continue
    return sorted(out, key=lambda x: x["name"])


def entry(name: str, info: os.stat_result) -> dict[str, Any]:
    kind = "dir" if stat.S_ISDIR(info.st_mode) else "link" if stat.S_ISLNK(info.st_mode) else \
        "file" if stat.S_ISREG(info.st_mode) else "other"
    return {"name": name, "type": kind, "size": info.st_size, "mtime": info.st_mtime}


def remove(path: str, recursive: bool, real_root: str) -> tuple[dict[str, Any], bytes]:
    if path == real_root:
        raise Refused(403, "the sandbox's root itself cannot be removed")
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode):
        if not recursive:
            os.rmdir(path)  # OSError 39 (not empty) -> 409
        else:
            shutil.rmtree(path)
    else:
        os.unlink(path)
    return {}, b""
