"""The executor's parts that need no process: requirement names and the packages key, the call
header, sessions' globals, output routing and batching, stopping a thread, the result headers, and
the runner's configuration for function sandboxes."""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import threading
import time
import types

import cloudpickle
import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.executor import calls, capture, interrupt, packages, sessions, wire
from levers9.executor.server import Channel
from levers9.runner.config import EXECUTOR_SOCKET, PACKAGES_DIR, Config

# ---- packages -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, canonical", [
    ("six", "six"), ("Foo_Bar", "foo-bar"), ("zope.interface", "zope-interface"), ("a__-._b", "a-b"),
    ("Django", "django"),
])
def test_canonical_name_is_pips(name, canonical):
    assert packages.canonical_name(name) == canonical


@given(st.text(st.sampled_from("aBc1-_."), min_size=1, max_size=12))
def test_canonical_name_is_idempotent_and_has_no_runs(name):
    once = packages.canonical_name(name)
    assert packages.canonical_name(once) == once and once == once.lower()
    assert "_" not in once and "." not in once and "--" not in once


@pytest.mark.parametrize("requirement, name", [
    ("six", "six"), (" six ", "six"), ("six==1.16.0", "six"), ("Foo_Bar[x,y]>=1; python_version>'3'", "foo-bar"),
    ("requests~=2.0", "requests"), ("numpy (>=1.0)", "numpy"), ("pkg!=1", "pkg"),
    ("git+https://example.com/x.git", None), ("./local/pkg", None), ("/abs/pkg", None), ("-r reqs.txt", None),
    ("name @ https://example.com/name.whl", None), ("not a requirement!", None), ("", None),
])
def test_requirement_name(requirement, name):
    assert packages.requirement_name(requirement) == name


def test_presence_uses_the_installed_distributions_and_exact_pins():
    import pytest as installed

    assert packages.is_present("pytest") and packages.is_present("PyTest>=1")
    assert packages.is_present(f"pytest=={installed.__version__}")
    assert not packages.is_present("pytest==0.0.1")
    assert not packages.is_present("levers9-surely-not-installed")
    assert not packages.is_present("git+https://example.com/pytest.git")
    assert packages.missing(["pytest", " levers9-b ", "", "levers9-a", "levers9-b"]) == ["levers9-a", "levers9-b"]


def test_packages_key_depends_on_the_set_and_the_python_only():
    key = packages.packages_key(["b", "a==1"], (3, 11))
    assert len(key) == 16 and int(key, 16) >= 0
    assert key == packages.packages_key(["a==1", " b "], (3, 11))
    assert key != packages.packages_key(["a==1", "b"], (3, 12))
    assert key != packages.packages_key(["a==2", "b"], (3, 11))
    assert packages.packages_key(["x"]) == packages.packages_key(["x"], sys.version_info[:2])


def test_a_failed_pip_keeps_its_last_lines(tmp_path):
    with pytest.raises(packages.InstallFailed) as failed:
        packages.ensure(["not a requirement!"], tmp_path, lambda line: None, lambda proc: None, lambda: False)
    assert "not a requirement!" in str(failed.value)
    assert not list(tmp_path.glob(f"*/{packages.MARKER}"))


# ---- the call header and its answers -----------------------------------------------------------------

def test_call_request_from_header():
    request = calls.CallRequest.from_header({"kind": "call", "call_id": "c1", "function": {"pickled": 10},
                                             "session": "s", "generator": True, "packages": ["six"], "timeout": 2})
    assert request == calls.CallRequest("c1", {"pickled": 10}, "s", True, ["six"], 2.0)
    assert calls.CallRequest.from_header({"function": {"module": "m", "qualname": "A.f"}}).timeout == 0.0


@pytest.mark.parametrize("header, error", [
    ({}, "the call's function is None"),
    ({"function": {"module": "m"}}, "expected {module, qualname} or {pickled: N}"),
    ({"function": {"pickled": 1}, "packages": "six"}, "the call's packages are 'six'"),
    ({"function": {"pickled": 1}, "timeout": -1}, "the call's timeout is -1"),
])
def test_bad_call_headers_are_protocol_errors(header, error):
    with pytest.raises(wire.ProtocolError, match=error.replace("{", r"\{").replace("}", r"\}")):
        calls.CallRequest.from_header(header)


def test_failure_names_the_type_and_starts_the_traceback_at_the_users_frame():
    def users_function():
        raise KeyError("k")

    try:
        calls.run(users_function, (), {}, False, lambda item: None)
    except KeyError as exc:
        outcome = calls.failure(exc.with_traceback(exc.__traceback__.tb_next))  # from calls.run, as in a sandbox
    header = outcome.header
    assert (header["ok"], header["error_type"], header["error"], header["reason"]) == (False, "builtins.KeyError",
                                                                                       "'k'", "")
    assert "in users_function" in header["traceback"] and "calls.py" not in header["traceback"]
    assert type(cloudpickle.loads(outcome.body)) is KeyError
    assert calls.stopped("cancelled").header["reason"] == "cancelled"


def test_an_exception_that_does_not_pickle_still_answers():
    class Unpicklable(Exception):
        def __reduce__(self):
            raise TypeError("no")

    outcome = calls.failure(Unpicklable("x"))
    assert outcome.body == b"" and outcome.header["error"] == "x"


def test_run_sends_a_generators_items():
    items: list = []
    assert calls.run(lambda n: (i for i in range(n)), (3,), {}, False, items.append) is None
    assert items == [0, 1, 2]


# ---- sessions --------------------------------------------------------------------------------------

SESSION_SOURCE = """
counter = 0


def helper():
    return counter


def bump():
    global counter
    counter += 1
    return helper()
"""


def unpickled_bump() -> types.FunctionType:
    """bump as a sandbox gets it: unpickled by value, with a fresh globals dict each time."""
    module = types.ModuleType("levers9_sessions_probe")
    exec(SESSION_SOURCE, module.__dict__)
    sys.modules[module.__name__] = module
    try:
        cloudpickle.register_pickle_by_value(module)
        return cloudpickle.loads(cloudpickle.dumps(module.bump))
    finally:
        cloudpickle.unregister_pickle_by_value(module)
        del sys.modules[module.__name__]


def test_a_session_keeps_its_globals_and_helpers_see_them():
    store = sessions.Sessions()
    assert [store.bind(unpickled_bump(), "s1")() for _ in range(3)] == [1, 2, 3]
    assert store.bind(unpickled_bump(), "s2")() == 1
    assert [store.bind(unpickled_bump(), "")() for _ in range(2)] == [1, 1]
    assert store.globals["s1"]["helper"].__globals__ is store.globals["s1"]
    store.forget("s1")
    assert store.bind(unpickled_bump(), "s1")() == 1


def test_rebind_keeps_the_functions_parts():
    def f(a, b=2, *, c=3):
        """doc"""
        return a + b + c

    f.tag = "x"  # type: ignore[attr-defined]
    g = sessions.rebind(f, {})
    assert (g(1), g.__doc__, g.__qualname__, g.__kwdefaults__, g.tag) == (6, "doc", f.__qualname__, {"c": 3}, "x")


# ---- output -------------------------------------------------------------------------------------------

def test_a_router_sends_only_the_capturing_threads_writes_to_its_sink():
    log, seen = io.StringIO(), []
    router = capture.Router(1, log)
    sink = capture.Sink(lambda fd, text: seen.append((fd, text)))
    with capture.capturing(sink):
        router.write("mine\n")
        other = threading.Thread(target=router.write, args=("started by the call\n",))
        capture._start_with_sink(threading.Thread.start)(other)  # what install() makes Thread.start do
        other.join()
        outsider = threading.Thread(target=router.write, args=("another thread's\n",))
        threading.Thread.start(outsider)
        outsider.join()
    router.write("after the call\n")
    assert seen == [(1, "mine\n"), (1, "started by the call\n")]
    assert log.getvalue() == "mine\nstarted by the call\nanother thread's\nafter the call\n"
    assert sink.closed


def test_the_channel_joins_queued_output_and_keeps_the_order():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        channel = Channel(ours)
        channel.queue.put(("output", 1, "a"))  # queued before the sender could take any
        for text in ("b", "c\n"):
            channel.output(1, text)
        channel.output(2, "err\n")
        channel.send({"kind": "result", "ok": True}, b"body")
        channel.close()
        frames = [wire.read_frame(theirs) for _ in range(3)]
    assert [h for h, _ in frames][:2] == [{"kind": "output", "fd": 1, "text": "abc\n"},
                                          {"kind": "output", "fd": 2, "text": "err\n"}]
    assert frames[2] == ({"kind": "result", "ok": True}, b"body")


# ---- stopping a thread -------------------------------------------------------------------------------

def test_a_stop_wakes_a_sleeping_armed_thread_and_raises_in_it():
    guard, seen = interrupt.Guard(), {}

    def call() -> None:
        try:
            try:
                guard.arm(0)
                interrupt.sleep(30)
                seen["returned"] = True
            finally:
                guard.disarm()
        except interrupt.CallCancelled:
            seen["cancelled"] = guard.reason

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    assert guard.stop("cancelled") and not guard.stop("again")
    thread.join(5)
    assert seen == {"cancelled": "cancelled"} and time.monotonic() - started < 1


def test_a_stop_before_arming_raises_at_arm_and_runs_hooks():
    guard, hooked = interrupt.Guard(), []
    guard.stop("timed out after 1 s")
    guard.on_stop(lambda: hooked.append(1))
    with pytest.raises(interrupt.CallCancelled):
        guard.arm(1)
    assert hooked == [1]
    interrupt.sleep(0.01)  # not armed: the plain sleep


STOP_THEN_TRACE = r"""
import sys, threading, time
from levers9.executor.interrupt import CallCancelled, Guard

def call(guard, seen, work):
    try:
        try:
            guard.arm(0)
            work()
            seen.append("ran to the end")
        finally:
            guard.disarm()
    except CallCancelled:
        seen.append("cancelled")

def blocked():  # in C when the stop comes: it fires right after
    threading.Event().wait(0.3)

def swallowing():  # user code that catches everything, CallCancelled too
    try:
        threading.Event().wait(0.3)
    except BaseException:
        pass

for work in (blocked, swallowing):
    guard, seen = Guard(), []
    thread = threading.Thread(target=call, args=(guard, seen, work))
    thread.start()
    time.sleep(0.05)
    guard.stop("cancelled")
    thread.join()
    print(seen, flush=True)

def entry(x):
    return x + 1
sys.settrace(lambda *a: None)  # a tracer: coverage, a debugger, Hypothesis
print("entered", entry(1), flush=True)
"""


def test_a_stopped_call_leaves_no_pending_exception_behind():
    """CPython 3.11 loops for ever at the next function entry under a tracer when an async
    exception was cleared with NULL, or is pending in a thread that no longer runs Python (a test
    process hung so, at 100% CPU). Run in a child: a hang here must not hang the suite."""
    out = subprocess.run([sys.executable, "-c", STOP_THEN_TRACE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines == ["['cancelled']", "['ran to the end']", "entered 2"], out


# ---- the runner's configuration --------------------------------------------------------------------

def test_function_sandbox_config():
    config = Config.from_env({"LEVERS9_RUNNER_KIND": "function"})
    assert (config.kind, config.module, config.handler, config.imports) == ("function", "", "", ())
    assert (config.executor_socket, config.packages_dir) == (EXECUTOR_SOCKET, PACKAGES_DIR)
    assert EXECUTOR_SOCKET == f"{wire.SOCKET_DIR}/{wire.SOCKET_NAME}"
    config = Config.from_env({"LEVERS9_RUNNER_KIND": "function", "LEVERS9_RUNNER_MODULE": "app",
                              "LEVERS9_RUNNER_IMPORTS": " numpy, ,pandas ", "LEVERS9_EXECUTOR_SOCKET": "/s/e.sock",
                              "LEVERS9_EXECUTOR_PACKAGES_DIR": "/p"})
    assert (config.module, config.imports, config.executor_socket, config.packages_dir) == (
        "app", ("numpy", "pandas"), "/s/e.sock", "/p")
    with pytest.raises(ValueError, match="LEVERS9_RUNNER_HANDLER is set without LEVERS9_RUNNER_MODULE"):
        Config.from_env({"LEVERS9_RUNNER_KIND": "function", "LEVERS9_RUNNER_HANDLER": "f"})
    with pytest.raises(ValueError, match="LEVERS9_RUNNER_MODULE and LEVERS9_RUNNER_HANDLER must name"):
        Config.from_env({"LEVERS9_RUNNER_KIND": "endpoint"})


def test_reseed_gives_fresh_random_numbers_and_temp_names():
    import random
    import tempfile

    from levers9.executor.reseed import reseed

    random.seed(7)
    first = random.random()
    random.seed(7)  # as two restores of one checkpoint would be
    done = reseed()
    assert random.random() != first and "random" in done and "tempfile" in done
    name = next(tempfile._get_candidate_names())
    reseed()
    assert next(tempfile._get_candidate_names()) != name
