"""The executor inside a function sandbox, as a real runner process (`LEVERS9_RUNNER_KIND=function`)
started the way a container starts it: `-S` (no site-packages), the sdk folder and a folder holding
only cloudpickle on PYTHONPATH. A small blocking client written on wire.py drives its unix socket."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import httpx
import pytest

from levers9.executor import packages, wire
from levers9.executor.calls import CallError

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk"

DEPLOYED = '''
import functools
import time


class Stub:
    """Like levers9's Function: a wrapper object whose own call must not run in the sandbox."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        raise RuntimeError("the wrapper ran in the sandbox")


@Stub
def wrapped(x):
    return x + 1


def add(a, b):
    return a + b


class Tools:
    @staticmethod
    def twice(x):
        return 2 * x

    class Inner:
        @staticmethod
        def countdown(n):
            yield from range(n, 0, -1)
'''

SESSION_MODULE = '''
counter = 0


def bump():
    global counter
    counter += 1
    return current()


def current():
    return counter
'''

ONLY_HERE = '''
class Thing:
    pass


def here():
    return "here"
'''

NETWORK_ERRORS = re.compile(r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
                            r"resolution|Name or service not known|Network is unreachable|ConnectTimeout|"
                            r"Read timed out|ProxyError|Max retries exceeded")


# ---- the runner and a client ----------------------------------------------------------------------

class Runner:
    def __init__(self, proc: subprocess.Popen, port: int, sock: Path, out: Path, err: Path):
        self.proc, self.port, self.sock, self.out, self.err = proc, port, sock, out, err
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)

    def status(self) -> dict:
        return self.http.get("/_levers9/status").json()

    def logs(self) -> str:
        return self.out.read_text() + self.err.read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_runner(base: Path, name: str, app_dir: Path, concurrency: int = 1, **env: str) -> Runner:
    vendor = base / "vendor"
    if not vendor.exists():  # what the worker binds at /opt/levers9-vendor: cloudpickle alone
        vendor.mkdir()
        (vendor / "cloudpickle").symlink_to(Path(cloudpickle.__file__).parent)
    port, sock = free_port(), base / name / "executor.sock"  # the socket's directory does not exist yet
    out, err = base / f"{name}.out", base / f"{name}.err"
    environ = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": f"{SDK}{os.pathsep}{vendor}",
               "LEVERS9_RUNNER_KIND": "function", "LEVERS9_RUNNER_HOST": "127.0.0.1",
               "LEVERS9_RUNNER_PORT": str(port), "LEVERS9_RUNNER_APP_DIR": str(app_dir),
               "LEVERS9_RUNNER_CONCURRENCY": str(concurrency), "LEVERS9_EXECUTOR_SOCKET": str(sock),
               "LEVERS9_EXECUTOR_PACKAGES_DIR": str(base / "pkgs"),
               "PIP_DEFAULT_TIMEOUT": "10", "PIP_RETRIES": "0", **env}  # offline: pip gives up soon
    for key in ("HOME", "PIP_CONFIG_FILE", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT",
                "SSL_CERT_FILE", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy"):
        if key in os.environ:  # pip in the sandbox reaches an index the way pip here does
            environ.setdefault(key, os.environ[key])
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen([sys.executable, "-S", "-m", "levers9.runner"], env=environ, stdout=o, stderr=e)
    runner = Runner(proc, port, sock, out, err)
    until(lambda: ready(runner), timeout=20, what=lambda: runner.logs())
    return runner


def ready(runner: Runner) -> bool:
    if runner.proc.poll() is not None:
        raise AssertionError(f"the runner exited with {runner.proc.returncode}:\n{runner.logs()}")
    try:
        return runner.http.get("/_levers9/health").status_code == 200 and runner.sock.exists()
    except httpx.TransportError:
        return False


def stop_runner(runner: Runner) -> None:
    runner.http.close()
    if runner.proc.poll() is None:
        runner.proc.kill()
    runner.proc.wait(5)


def until(fn, timeout: float = 10.0, what=lambda: ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"condition not reached in time {what()}")


@dataclass
class Reply:
    frames: list[tuple[float, dict, bytes]]  # (seconds after the call was sent, header, body)

    @property
    def result(self) -> dict:
        return self.frames[-1][1]

    @property
    def value(self) -> Any:
        assert self.result["ok"], self.result
        return cloudpickle.loads(self.frames[-1][2])

    @property
    def body(self) -> bytes:
        return self.frames[-1][2]

    def outputs(self, fd: int | None = None) -> str:
        return "".join(h["text"] for _, h, _ in self.frames if h["kind"] == "output" and fd in (None, h["fd"]))

    @property
    def items(self) -> list:
        return [cloudpickle.loads(b) for _, h, b in self.frames if h["kind"] == "item"]


def connect(runner: Runner) -> tuple[socket.socket, dict]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(60)
    sock.connect(str(runner.sock))
    hello, _ = wire.read_frame(sock)
    wire.check_hello(hello)
    return sock, hello


def send_call(sock: socket.socket, fn: Any, *args: Any, session: str = "", generator: bool = False,
              packages: tuple[str, ...] = (), timeout: float = 0, **kwargs: Any) -> float:
    arguments = cloudpickle.dumps((args, kwargs))
    if isinstance(fn, tuple):  # (module, qualname): a deployed function
        function, body = {"module": fn[0], "qualname": fn[1]}, arguments
    else:
        pickled = cloudpickle.dumps(fn)
        function, body = {"pickled": len(pickled)}, pickled + arguments
    wire.send_frame(sock, {"kind": "call", "call_id": uuid.uuid4().hex[:8], "function": function,
                           "session": session, "generator": generator, "packages": list(packages),
                           "timeout": timeout}, body)
    return time.monotonic()


def read_reply(sock: socket.socket, sent: float) -> Reply:
    frames = []
    while True:
        header, body = wire.read_frame(sock)
        frames.append((time.monotonic() - sent, header, body))
        if header["kind"] == "result":
            return Reply(frames)


def call(runner: Runner, fn: Any, *args: Any, **options: Any) -> Reply:
    sock, _ = connect(runner)
    with sock:
        return read_reply(sock, send_call(sock, fn, *args, **options))


# ---- fixtures ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("executor")
    (base / "app").mkdir()
    (base / "app" / "deployed.py").write_text(DEPLOYED)
    (base / "app" / "preloaded.py").write_text("LOADED = True\n")
    (base / "local").mkdir()  # modules of the caller only, not of the sandbox
    (base / "local" / "sessmod.py").write_text(SESSION_MODULE)
    (base / "local" / "levers9_only_here.py").write_text(ONLY_HERE)
    sys.path.insert(0, str(base / "local"))
    yield base
    sys.path.remove(str(base / "local"))


@pytest.fixture(scope="module")
def runner(base):
    """A sandbox of a deployed module, concurrency 2, with modules to import at load."""
    r = start_runner(base, "main", base / "app", concurrency=2, LEVERS9_RUNNER_MODULE="deployed",
                     LEVERS9_RUNNER_HANDLER="add", LEVERS9_RUNNER_IMPORTS="preloaded, levers9_no_such_import")
    yield r
    stop_runner(r)


@pytest.fixture(scope="module")
def single(base):
    """An ad-hoc sandbox (every call brings its function), concurrency 1."""
    r = start_runner(base, "single", base / "app", concurrency=1)
    yield r
    stop_runner(r)


# ---- the protocol -----------------------------------------------------------------------------------

def test_hello_and_ping(runner):
    sock, hello = connect(runner)
    with sock:
        assert hello["generation"] == wire.GENERATION
        assert hello["python"] == "%d.%d" % sys.version_info[:2]
        wire.send_frame(sock, {"kind": "ping"})
        pong, _ = wire.read_frame(sock)
    assert pong == {"kind": "pong", "state": "ready", "inflight": 0}


def test_a_closure_a_lambda_and_a_coroutine_return_their_values(runner):
    factor = 7

    def scaled(x, plus=0):
        return x * factor + plus

    async def later(x):
        import asyncio
        await asyncio.sleep(0.01)
        return {"async": x}

    assert call(runner, scaled, 6, plus=1).value == 43
    assert call(runner, lambda: [1, "two", None]).value == [1, "two", None]
    assert call(runner, later, 5).value == {"async": 5}


def test_an_exception_arrives_with_its_type_traceback_and_itself(runner):
    def fails_here(x):
        raise ValueError(f"bad input {x}")

    reply = call(runner, fails_here, 3)
    result = reply.result
    assert (result["ok"], result["error_type"], result["error"], result["reason"]) == (
        False, "builtins.ValueError", "bad input 3", "")
    assert "in fails_here" in result["traceback"] and 'raise ValueError(f"bad input {x}")' in result["traceback"]
    assert "levers9/executor" not in result["traceback"]  # the user's frames, not the executor's
    exc = cloudpickle.loads(reply.body)
    assert type(exc) is ValueError and exc.args == ("bad input 3",)


def test_prints_arrive_as_they_happen_and_before_the_result(runner):
    def chatty():
        print("before the sleep")
        time.sleep(1.0)
        print("after the sleep", file=sys.stderr)
        return "done"

    reply = call(runner, chatty)
    kinds = [h["kind"] for _, h, _ in reply.frames]
    assert kinds[-1] == "result" and set(kinds[:-1]) == {"output"}
    first_at, first, _ = reply.frames[0]
    assert (first["fd"], first["text"]) == (1, "before the sleep\n")
    assert first_at < 0.8 <= 1.0 <= reply.frames[-1][0]  # the print arrived while the call slept
    assert reply.outputs(2) == "after the sleep\n" and reply.value == "done"
    assert "before the sleep" in runner.logs()  # and the container log has it too


def test_a_thread_the_call_starts_prints_to_the_caller_and_two_calls_never_cross(runner):
    def with_thread():
        t = threading.Thread(target=lambda: print("from a thread"))
        t.start()
        t.join()
        return "joined"

    def tagged(tag):
        for _ in range(30):
            print(tag)
            time.sleep(0.005)
        return tag

    reply = call(runner, with_thread)
    assert reply.outputs(1) == "from a thread\n" and reply.value == "joined"
    replies: dict[str, Reply] = {}
    threads = [threading.Thread(target=lambda t=t: replies.update({t: call(runner, tagged, t)})) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert replies["a"].outputs() == "a\n" * 30 and replies["b"].outputs() == "b\n" * 30


def test_a_generator_sends_its_items_then_none(runner):
    def squares(n):
        for i in range(n):
            yield i * i

    reply = call(runner, squares, 4)
    assert reply.items == [0, 1, 4, 9] and reply.value is None
    assert [h["kind"] for _, h, _ in reply.frames] == ["item"] * 4 + ["result"]
    letters = call(runner, lambda: iter("ab"), generator=True)  # not a generator function: the header says so
    assert letters.items == ["a", "b"]


def test_session_globals_persist_and_are_not_shared(runner):
    import sessmod

    cloudpickle.register_pickle_by_value(sessmod)  # what the SDK does for the caller's own modules
    try:
        assert [call(runner, sessmod.bump, session="s1").value for _ in range(3)] == [1, 2, 3]
        assert call(runner, sessmod.bump, session="s2").value == 1
        assert [call(runner, sessmod.bump).value for _ in range(2)] == [1, 1]  # no session: nothing shared
        assert call(runner, sessmod.bump, session="s1").value == 4
        assert call(runner, sessmod.current, session="s1").value == 4  # a helper sees the session's state
    finally:
        cloudpickle.unregister_pickle_by_value(sessmod)


# ---- deployed and unloadable functions ----------------------------------------------------------------

def test_a_deployed_function_by_module_and_qualname(runner):
    assert call(runner, ("deployed", "add"), 2, 3).value == 5
    assert call(runner, ("deployed", "Tools.twice"), 21).value == 42
    assert call(runner, ("deployed", "Tools.Inner.countdown"), 3).items == [3, 2, 1]
    assert call(runner, ("deployed", "wrapped"), 1).value == 2  # what the wrapper object wraps runs
    missing = call(runner, ("deployed", "nope")).result
    assert missing["error_type"] == "levers9.executor.calls.CallError" and "module deployed has no 'nope'" in missing[
        "error"]


def test_functions_and_arguments_that_do_not_load_say_why(runner):
    import levers9_only_here

    unpicklable = call(runner, levers9_only_here.here)  # pickled by reference: the sandbox lacks the module
    assert unpicklable.result["error"] == ("the function could not be unpickled in the sandbox: ModuleNotFoundError: "
                                           "No module named 'levers9_only_here' (add it to packages= or the image)")
    assert isinstance(cloudpickle.loads(unpicklable.body), CallError)
    arguments = call(runner, lambda thing: thing, levers9_only_here.Thing())
    assert arguments.result["error"].startswith("the arguments could not be unpickled in the sandbox: "
                                                "ModuleNotFoundError: No module named 'levers9_only_here'")
    module = call(runner, ("levers9_no_such_module", "f")).result
    assert "the function's module levers9_no_such_module could not be imported in the sandbox" in module["error"]


def test_modules_to_import_at_load_are_imported_and_a_failing_one_is_only_logged(runner):
    assert call(runner, lambda: "preloaded" in sys.modules).value is True
    assert "levers9_no_such_import could not be imported" in runner.logs()


# ---- stopping a call -----------------------------------------------------------------------------------

def test_a_cancel_stops_a_sleeping_call_and_frees_the_slot(single):
    def sleeper():
        try:
            time.sleep(30)
        except Exception:  # a cancel is not an Exception: the call cannot swallow it this way
            return "swallowed"

    sock, _ = connect(single)
    with sock:
        sent = send_call(sock, sleeper)
        until(lambda: single.status()["inflight"] == 1)
        cancelled_at = time.monotonic()
        wire.send_frame(sock, {"kind": "cancel", "reason": "cancelled"})
        reply = read_reply(sock, sent)
    assert reply.result["ok"] is False and reply.result["reason"] == "cancelled"
    assert time.monotonic() - cancelled_at < 2.0
    started = time.monotonic()
    assert call(single, lambda: "next").value == "next"  # concurrency 1: the slot is free again
    assert time.monotonic() - started < 2.0


def test_a_timeout_stops_a_busy_call(single):
    def busy():
        n = 0
        while True:
            n += 1

    reply = call(single, busy, timeout=0.5)
    assert reply.result["reason"] == "timed out after 0.5 s" and reply.frames[-1][0] < 2.0
    assert call(single, lambda: "after").value == "after"


def test_closing_the_connection_mid_call_frees_the_slot(single):
    before = single.status()["requests"]
    sock, _ = connect(single)
    send_call(sock, lambda: time.sleep(30))
    until(lambda: single.status()["inflight"] == 1)
    sock.close()
    until(lambda: single.status()["inflight"] == 0, timeout=2.0)
    assert call(single, lambda: 1).value == 1
    status = single.status()
    assert status["requests"] == before + 2 and abs(status["last_request_at"] - time.time()) < 5
    assert until(lambda: "the caller went away" in single.logs())


# ---- packages -----------------------------------------------------------------------------------------

def test_packages_are_installed_once_and_imported(single, base):
    def uses_humanize():
        import humanize
        return humanize.intcomma(1234567)

    reply = call(single, uses_humanize, packages=("humanize",))
    if not reply.result["ok"] and NETWORK_ERRORS.search(reply.outputs(2) + reply.result["error"]):
        pytest.skip(f"pip cannot reach a package index from here: {reply.result['error'][-300:]}")
    assert reply.value == "1,234,567"
    assert "installing humanize" in reply.outputs(2)
    key = packages.packages_key(["humanize"])
    assert (base / "pkgs" / key / packages.MARKER).exists()
    again = call(single, uses_humanize, packages=("humanize",))  # the sandbox has it now: no install
    assert again.value == "1,234,567" and "installing" not in again.outputs()


def test_a_bad_requirement_fails_the_call(single):
    reply = call(single, lambda: "never", packages=("not a requirement!",))
    assert reply.result["ok"] is False and reply.result["error"].startswith("installing packages failed: ")
    assert reply.result["error_type"] == "levers9.executor.calls.CallError"
    assert reply.outputs(2)  # pip's output reached the caller


# ---- the process ------------------------------------------------------------------------------------

def test_the_socket_comes_back_when_removed_and_sigterm_removes_it(base):
    r = start_runner(base, "restart", base / "app")
    try:
        r.sock.unlink()  # as after a restore into a fresh socket directory
        until(r.sock.exists, timeout=3)
        assert call(r, lambda: "again").value == "again"
        r.proc.send_signal(signal.SIGTERM)
        assert r.proc.wait(10) == 0
        assert not r.sock.exists()
    finally:
        stop_runner(r)


def test_http_calls_are_refused_and_status_counts_executor_calls(single):
    before = single.status()["requests"]
    answer = single.http.post("/", json={})
    assert answer.status_code == 404 and "function sandbox" in answer.json()["error"]
    call(single, lambda: None)
    assert single.status()["requests"] == before + 2  # the HTTP request counts too: it was a request


def test_the_executor_and_runner_import_only_the_standard_library():
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(SDK)!r})
        import levers9.runner.main, levers9.executor.server, levers9.executor.packages
        third_party = sorted(
            name for name in sys.modules
            if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "levers9"
            and name not in sys.builtin_module_names and name != "__main__")
        print(",".join(third_party))
    """)
    done = subprocess.run([sys.executable, "-S", "-I", "-c", code], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"third-party modules imported: {done.stdout}"


def test_a_rest_call_speaks_json_both_ways(runner):
    import json as jsonlib

    sock, _ = connect(runner)
    with sock:
        wire.send_frame(sock, {"kind": "call", "call_id": "rest1", "function": {"module": "deployed", "qualname": "add"},
                               "json": True}, jsonlib.dumps({"args": [2, 40], "kwargs": {}}).encode())
        reply = read_reply(sock, time.monotonic())
    assert reply.result["ok"] and jsonlib.loads(reply.body) == 42
    sock, _ = connect(runner)
    with sock:
        wire.send_frame(sock, {"kind": "call", "call_id": "rest2", "function": {"module": "deployed",
                                                                             "qualname": "Tools.twice"},
                               "json": True}, b'{"args": [[1]], "kwargs": {}}')
        ok = read_reply(sock, time.monotonic())
    assert ok.result["ok"] and jsonlib.loads(ok.body) == [1, 1]
