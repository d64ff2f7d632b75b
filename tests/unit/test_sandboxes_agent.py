"""The sandbox agent (levers9.executor.sandbox_ops) on a real executor socket in this process, as the
gateway's relay reaches it: exec streams output as it is written, stdin, exit codes (127 for a
missing program), files confined to the workdir (hostile paths and links refused), the size limit."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from levers9.executor import wire
from levers9.executor.sandbox_rules import MAX_FILE_BYTES
from levers9.executor.server import ExecutorServer


class Host:
    def __init__(self) -> None:
        self.inflight, self.last = 0, 0.0
        self.lock = threading.Lock()

    def begin(self) -> None:
        with self.lock:
            self.inflight += 1

    def end(self) -> None:
        with self.lock:
            self.inflight -= 1
            self.last = time.time()


@pytest.fixture
def agent(tmp_path):
    sock_dir = Path(f"/tmp/l9-sbx-{os.getpid()}-{time.monotonic_ns()}")
    host = Host()
    server = ExecutorServer(str(sock_dir / "e.sock"), str(tmp_path / "pk"), host)  # type: ignore[arg-type]
    server._bind()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    root = tmp_path / "root"
    yield {"path": sock_dir / "e.sock", "root": str(root), "host": host, "tmp": tmp_path}
    server.stop()
    thread.join(5)
    for p in sock_dir.iterdir():
        p.unlink()
    sock_dir.rmdir()


def connect(agent: dict[str, Any]) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(agent["path"]))
    hello, _ = wire.read_frame(s)
    assert hello["kind"] == "hello"
    return s


def ask(agent: dict[str, Any], header: dict[str, Any], body: bytes = b"") -> tuple[dict[str, Any], bytes]:
    with connect(agent) as s:
        wire.send_frame(s, {"root": agent["root"], **header}, body)
        return wire.read_frame(s)


def run(agent: dict[str, Any], *argv: str) -> tuple[int, bytes, bytes]:
    with connect(agent) as s:
        wire.send_frame(s, {"kind": "exec", "argv": list(argv), "root": agent["root"]})
        out = {1: b"", 2: b""}
        while True:
            frame, data = wire.read_frame(s)
            if frame["kind"] == "stream":
                out[frame["fd"]] += data
            if frame["kind"] == "exit":
                return frame["code"], out[1], out[2]


def test_exec_streams_output_as_written_and_takes_stdin(agent):
    program = "import sys\nprint('ready', flush=True)\nline = sys.stdin.readline()\nprint('got', line.strip())\nsys.exit(3)"
    with connect(agent) as s:
        wire.send_frame(s, {"kind": "exec", "argv": [sys.executable, "-c", program], "root": agent["root"]})
        started, _ = wire.read_frame(s)
        assert started["kind"] == "started" and started["exec_id"]
        data = b""
        while not data.endswith(b"\n"):  # arrives while the program still waits on its stdin
            first, chunk = wire.read_frame(s)
            assert first["kind"] == "stream" and first["fd"] == 1
            data += chunk
        assert data == b"ready\n"
        assert agent["host"].inflight == 1  # a running program keeps the sandbox busy (its idle timeout)
        ok, _ = ask(agent, {"kind": "stdin", "exec_id": started["exec_id"]}, b"hello\n")
        assert ok["kind"] == "ok" and ok["written"] == 6
        frames = []
        while not frames or frames[-1][0]["kind"] != "exit":
            frames.append(wire.read_frame(s))
    assert b"".join(d for f, d in frames if f["kind"] == "stream") == b"got hello\n"
    assert frames[-1][0]["code"] == 3
    assert os.path.isdir(agent["root"])  # programs start in the workdir, made on first use


def test_stdin_close_ends_a_reader_and_an_unknown_exec_is_404(agent):
    with connect(agent) as s:
        wire.send_frame(s, {"kind": "exec", "argv": ["cat"], "root": agent["root"]})
        started, _ = wire.read_frame(s)
        ask(agent, {"kind": "stdin", "exec_id": started["exec_id"], "close": True}, b"abc")
        got = b""
        while (frame := wire.read_frame(s))[0]["kind"] != "exit":
            got += frame[1]
    assert got == b"abc" and frame[0]["code"] == 0
    refused, _ = ask(agent, {"kind": "stdin", "exec_id": "nope"}, b"x")
    assert refused == {"kind": "error", "status": 404, "error": refused["error"]} and "no exec" in refused["error"]
    ended, _ = ask(agent, {"kind": "stdin", "exec_id": started["exec_id"]}, b"x")
    assert ended["status"] == 409 and "has ended (exit code 0)" in ended["error"]
    assert ask(agent, {"kind": "stdin", "exec_id": started["exec_id"], "close": True})[0]["kind"] == "ok"  # a no-op


def test_a_missing_program_exits_127_with_its_error_on_stderr(agent):
    code, out, err = run(agent, "no-such-program-here", "x")
    assert (code, out) == (127, b"") and b"no-such-program-here: command not found" in err
    assert run(agent, "sh", "-c", "kill -9 $$")[0] == 137
    deadline = time.monotonic() + 5  # the op ends (host.end) just after its exit frame went out
    while agent["host"].inflight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert agent["host"].inflight == 0


def test_an_exec_past_its_timeout_is_killed_with_what_it_started_and_exits_124(agent, tmp_path):
    pidfile = tmp_path / "child.pid"
    with connect(agent) as s:  # a shell that starts a child of its own, then both wait for ever
        wire.send_frame(s, {"kind": "exec", "argv": ["sh", "-c", f"sleep 300 & echo $! > {pidfile}; echo up; wait"],
                            "root": agent["root"], "timeout": 1})
        frames = []
        while not frames or frames[-1][0]["kind"] != "exit":
            frames.append(wire.read_frame(s))
    exit_frame = frames[-1][0]
    assert exit_frame["code"] == 124 and exit_frame["timed_out"] is True
    assert b"up" in b"".join(d for f, d in frames if f["kind"] == "stream" and f["fd"] == 1)
    assert b"ran past its timeout of 1 s" in b"".join(d for f, d in frames if f["kind"] == "stream" and f["fd"] == 2)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10  # SIGKILL is delivered at once; the zombie is reaped by its parent's end
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)
    assert run(agent, "true")[0] == 0  # an exec without a timeout is not affected


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("timeout", [0, -1, "1", True, 86_401])
def test_a_bad_exec_timeout_is_refused_with_400(agent, timeout):
    refused, _ = ask(agent, {"kind": "exec", "argv": ["true"], "timeout": timeout})
    assert refused["kind"] == "error" and refused["status"] == 400 and "timeout" in refused["error"]


def test_files_round_trip_list_and_remove(agent):
    assert ask(agent, {"kind": "file-write", "path": "d/a.txt"}, b"\x00bytes\xff")[0] == {"kind": "ok", "size": 7}
    header, data = ask(agent, {"kind": "file-read", "path": agent["root"] + "/d/a.txt"})
    assert header["kind"] == "ok" and data == b"\x00bytes\xff"
    entries = ask(agent, {"kind": "file-ls", "path": "d"})[0]["entries"]
    assert [(e["name"], e["type"], e["size"]) for e in entries] == [("a.txt", "file", 7)]
    assert ask(agent, {"kind": "file-rm", "path": "d"})[0]["status"] == 409  # not empty
    assert ask(agent, {"kind": "file-rm", "path": "d", "recursive": True})[0]["kind"] == "ok"
    assert ask(agent, {"kind": "file-read", "path": "d/a.txt"})[0]["status"] == 404


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "a/../../x"])
def test_paths_that_leave_the_root_are_refused(agent, path):
    for kind in ("file-write", "file-read", "file-ls", "file-rm"):
        header, _ = ask(agent, {"kind": kind, "path": path}, b"x")
        assert header["kind"] == "error" and header["status"] == 403 and "leaves the sandbox's root" in header["error"]
    assert not (agent["tmp"] / "outside").exists()


def test_a_symbolic_link_out_of_the_root_is_refused_but_may_be_removed(agent):
    secret = agent["tmp"] / "secret"
    secret.write_text("host")
    os.makedirs(agent["root"])
    os.symlink(secret, agent["root"] + "/link")
    os.symlink(agent["tmp"], agent["root"] + "/dirlink")
    for kind, path in (("file-read", "link"), ("file-write", "link"), ("file-ls", "dirlink"),
                       ("file-write", "dirlink/new"), ("file-rm", "dirlink/secret")):
        header, _ = ask(agent, {"kind": kind, "path": path}, b"x")
        assert header["status"] == 403 and "symbolic link" in header["error"], (kind, path)
    assert secret.read_text() == "host" and not (agent["tmp"] / "new").exists()
    assert ask(agent, {"kind": "file-rm", "path": "link"})[0]["kind"] == "ok"  # the link, not its target
    assert secret.exists() and not os.path.lexists(agent["root"] + "/link")


def test_a_file_over_the_limit_is_refused_with_413(agent):
    header, _ = ask(agent, {"kind": "file-write", "path": "big"}, b"x" * (MAX_FILE_BYTES + 1))
    assert header["status"] == 413
    with open(os.path.join(agent["root"], "big"), "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    assert ask(agent, {"kind": "file-read", "path": "big"})[0]["status"] == 413
