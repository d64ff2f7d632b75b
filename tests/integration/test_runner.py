"""The runner (`python -m levers9.runner`) as a real process, the way a container runs it: `-S` (no
site-packages), only the sdk folder on PYTHONPATH, the app in LEVERS9_RUNNER_APP_DIR."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk"
EXAMPLES = ROOT / "examples"

APP = '''
import asyncio
import time

from levers9 import App

app = App("runner-test")


def load():
    time.sleep(0.8)
    return {"greeting": "hi"}


@app.endpoint(on_start=load)
def greet(context, name: str = "world", times: int = 1):
    return {"message": f"{context.on_start_value['greeting']}, {name}" * times,
            "request_id": context.request_id, "method": context.method, "path": context.path}


def echo(**inputs):
    return inputs


def needs(x):
    return x


def boom():
    raise ValueError("nope")


def not_json():
    return {1, 2}


def slow(seconds: float = 0.5):
    time.sleep(float(seconds))
    return {"slept": float(seconds)}


async def slow_async(seconds: float = 0.0):
    await asyncio.sleep(float(seconds))
    return {"async": True, "slept": float(seconds)}


async def asgi_boom(scope, receive, send):
    raise RuntimeError("asgi app broke")


def asgi_factory(context):
    greeting = context.on_start_value

    async def asgi(scope, receive, send):
        body = (await receive())["body"]
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x-path", scope["path"].encode())]})
        await send({"type": "http.response.body", "body": f"{greeting}:{scope['method']}:".encode() + body})
    return asgi


def load_text():
    return "factory"
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runner:
    def __init__(self, proc: subprocess.Popen, port: int, out: Path, err: Path):
        self.proc, self.port, self.out, self.err = proc, port, out, err
        self.url = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def health(self) -> httpx.Response:
        return self.http.get("/_levers9/health")

    def wait_ready(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.health().status_code == 200:
                return
            time.sleep(0.02)
        raise AssertionError(f"not ready: {self.health().text}\n{self.err.read_text()}")

    def logs(self) -> tuple[str, str]:
        return self.out.read_text(), self.err.read_text()


@pytest.fixture
def app_dir(tmp_path):
    (tmp_path / "testapp.py").write_text(APP)
    return tmp_path


@pytest.fixture
def start(tmp_path):
    started: list[Runner] = []

    def start(app_dir: Path, module: str, handler: str, wait: bool = True, **env: str) -> Runner:
        port = free_port()
        out, err = tmp_path / f"{port}.out", tmp_path / f"{port}.err"
        environ = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(SDK), "LEVERS9_RUNNER_APP_DIR": str(app_dir),
                   "LEVERS9_RUNNER_MODULE": module, "LEVERS9_RUNNER_HANDLER": handler,
                   "LEVERS9_RUNNER_HOST": "127.0.0.1", "LEVERS9_RUNNER_PORT": str(port),
                   **{f"LEVERS9_RUNNER_{k.upper()}": v for k, v in env.items()}}
        with out.open("w") as o, err.open("w") as e:
            proc = subprocess.Popen([sys.executable, "-S", "-m", "levers9.runner"], env=environ, stdout=o, stderr=e)
        runner = Runner(proc, port, out, err)
        started.append(runner)
        deadline = time.monotonic() + 10
        while True:  # it listens before it imports anything of the app
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(f"runner did not listen: {err.read_text()}") from None
                time.sleep(0.01)
        if wait:
            runner.wait_ready()
        return runner

    yield start
    for r in started:
        r.http.close()
        if r.proc.poll() is None:
            r.proc.kill()
        r.proc.wait(5)


# ---- endpoints ----------------------------------------------------------------------------------------

def test_health_goes_from_starting_to_ready_and_on_start_value_is_used(start, app_dir):
    r = start(app_dir, "testapp", "greet", wait=False, on_start="load")
    first = r.health()
    assert (first.status_code, first.json()) == (503, {"state": "starting"})
    assert r.http.get("/_levers9/status").json()["state"] == "starting"
    r.wait_ready()
    assert r.health().json() == {"state": "ready"}
    answer = r.http.post("/anything", json={"name": "levers9"}, headers={"X-Request-Id": "req-1"})
    assert answer.status_code == 200
    assert answer.json() == {"message": "hi, levers9", "request_id": "req-1", "method": "POST", "path": "/anything"}
    status = r.http.get("/_levers9/status").json()
    assert set(status) == {"state", "inflight", "requests", "last_request_at", "on_start_seconds"}
    assert status["state"] == "ready" and status["requests"] == 1 and status["inflight"] == 0
    assert status["on_start_seconds"] >= 0.7 and abs(status["last_request_at"] - time.time()) < 5
    assert "POST /anything 200" in r.logs()[0]


def test_inputs_become_keyword_arguments(start, app_dir):
    r = start(app_dir, "testapp", "greet", on_start="load")
    assert r.http.post("/", json={"name": "a", "times": 2}).json()["message"] == "hi, ahi, a"
    assert r.http.get("/", params={"name": "q"}).json()["message"] == "hi, q"  # query params are strings
    assert r.http.post("/").json()["message"] == "hi, world"  # no body: the defaults
    assert r.http.post("/", json={}).json()["request_id"]  # one is made up without X-Request-Id

    not_json = r.http.post("/", content=b"{nope")
    assert not_json.status_code == 400 and "the body is not JSON" in not_json.json()["error"]
    a_list = r.http.post("/", json=[1, 2])
    assert a_list.status_code == 400 and "JSON list, not an object" in a_list.json()["error"]
    wrong = r.http.post("/", json={"nam": "x"})
    assert wrong.status_code == 422
    assert "unexpected keyword argument 'nam'" in wrong.json()["error"] and "greet(name: str" in wrong.json()["error"]
    reserved = r.http.post("/", json={"context": 1})
    assert reserved.status_code == 422 and "reserved" in reserved.json()["error"]


def test_hello_example(start):
    r = start(EXAMPLES, "hello", "hello", on_start="load")
    assert r.http.post("/", json={"name": "levers9"}).json() == {"message": "hello, levers9"}


def test_missing_argument_is_422_and_kwargs_functions_take_anything(start, app_dir):
    r = start(app_dir, "testapp", "needs")
    missing = r.http.post("/", json={})
    assert missing.status_code == 422 and "missing a required argument: 'x'" in missing.json()["error"]
    assert r.http.post("/", json={"x": [1, {"a": None}]}).json() == [1, {"a": None}]


def test_handler_errors_are_500_with_the_traceback(start, app_dir):
    r = start(app_dir, "testapp", "boom")
    answer = r.http.post("/", json={})
    assert answer.status_code == 500
    assert answer.json()["error"] == "ValueError: nope"
    assert 'raise ValueError("nope")' in answer.json()["traceback"]
    out, err = until(lambda: (lambda o, e: (o, e) if "POST / 500" in o and "ValueError: nope" in e else None)(*r.logs()))
    assert "ValueError: nope" in err and "POST / 500" in out
    assert r.health().status_code == 200  # the runner goes on


def test_a_return_value_that_is_not_json_is_500(start, app_dir):
    r = start(app_dir, "testapp", "not_json")
    answer = r.http.post("/")
    assert answer.status_code == 500 and "return value is not JSON" in answer.json()["error"]


def test_async_handler(start, app_dir):
    r = start(app_dir, "testapp", "slow_async")
    assert r.http.post("/", json={"seconds": 0.05}).json() == {"async": True, "slept": 0.05}


def test_timeout_is_504_and_body_limit_is_413(start, app_dir):
    r = start(app_dir, "testapp", "slow", timeout="0.3", max_body="100")
    started = time.monotonic()
    answer = r.http.post("/", json={"seconds": 10})
    assert answer.status_code == 504 and "0.3 s" in answer.json()["error"]
    assert time.monotonic() - started < 8  # answered at its timeout, not when the handler ended
    big = r.http.post("/", content=b"x" * 101)
    assert big.status_code == 413 and "over the limit of 100 bytes" in big.json()["error"]


# ---- ASGI -------------------------------------------------------------------------------------------

def test_asgi_example_with_a_streamed_body(start):
    r = start(EXAMPLES, "asgi_app", "web", kind="asgi", concurrency="4")
    assert r.http.get("/").json() == {"hello": "asgi"}
    assert r.http.post("/echo", content=b"ping").content == b"ping"
    assert r.http.get("/missing").status_code == 404
    head = r.http.head("/")
    assert head.status_code == 200 and head.content == b""

    started = time.monotonic()
    arrivals = []
    with r.http.stream("GET", "/stream", params={"n": "3"}) as answer:
        assert answer.headers["transfer-encoding"] == "chunked"
        for line in answer.iter_lines():
            arrivals.append((round(time.monotonic() - started, 2), line))
    assert [line for _, line in arrivals] == ["line 0", "line 1", "line 2"]
    # each line as it is produced, 0.2 s apart, not all at the end
    assert arrivals[0][0] < 0.3 and arrivals[2][0] - arrivals[0][0] >= 0.3


def test_asgi_factory_gets_the_on_start_value_and_errors_are_500(start, app_dir):
    r = start(app_dir, "testapp", "asgi_factory", kind="asgi", on_start="load_text")
    answer = r.http.post("/a/b%20c", content=b"body")
    assert (answer.status_code, answer.text, answer.headers["x-path"]) == (201, "factory:POST:body", "/a/b c")
    r2 = start(app_dir, "testapp", "asgi_boom", kind="asgi")
    broken = r2.http.get("/")
    assert broken.status_code == 500 and broken.json()["error"] == "RuntimeError: asgi app broke"


# ---- failing to start -------------------------------------------------------------------------------

@pytest.mark.parametrize("source, on_start, error", [
    ("import no_such_module_levers9\n", "", "ModuleNotFoundError: No module named 'no_such_module_levers9'"),
    ("def load():\n    raise RuntimeError('no model')\ndef f():\n    pass\n", "load", "RuntimeError: no model"),
    ("x = 1\n", "", "has no attribute 'f'"),
])
def test_a_failed_start_is_health_500_then_exit_3(tmp_path, start, source, on_start, error):
    (tmp_path / "broken.py").write_text(source)
    r = start(tmp_path, "broken", "f", wait=False, on_start=on_start)
    deadline = time.monotonic() + 5
    while (health := r.health()).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert health.status_code == 500
    assert health.json()["state"] == "failed" and error in health.json()["error"]
    assert r.proc.wait(5) == 3
    assert "Traceback" in r.logs()[1] and error in r.logs()[1]


# ---- concurrency and stopping -----------------------------------------------------------------------

def timed_pair(r: Runner, seconds: float) -> tuple[float, list[int]]:
    codes: list[int] = []

    def call() -> None:
        codes.append(r.http.post("/", json={"seconds": seconds}).status_code)

    threads = [threading.Thread(target=call) for _ in range(2)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - started, codes


def until(fn, timeout: float = 10.0):
    """fn's first truthy value, polled; AssertionError when none comes in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


@pytest.mark.parametrize("handler", ["slow", "slow_async"])
def test_concurrency_limit_is_respected(start, app_dir, handler):
    one = start(app_dir, "testapp", handler, concurrency="1")
    two = start(app_dir, "testapp", handler, concurrency="2")
    serial, codes = timed_pair(one, 0.4)
    assert codes == [200, 200] and serial >= 0.8
    parallel, codes = timed_pair(two, 0.4)
    assert codes == [200, 200] and parallel < 0.75


def test_sigterm_finishes_the_request_in_flight_then_exits_0(start, app_dir):
    r = start(app_dir, "testapp", "slow")
    result = {}

    def call() -> None:
        result["answer"] = r.http.post("/", json={"seconds": 1.0})

    t = threading.Thread(target=call)
    t.start()
    # the call is in the handler (asked on a connection of its own: the client is busy in the thread)
    until(lambda: httpx.get(f"{r.url}/_levers9/status", timeout=2).json().get("inflight") == 1)
    r.proc.send_signal(signal.SIGTERM)

    def refused() -> bool:
        try:
            httpx.get(f"{r.url}/_levers9/health", timeout=2)
        except httpx.ConnectError:
            return True
        except httpx.TransportError:  # accepted just before the listener closed: not refusing yet
            return False
        return False

    until(refused)  # no longer accepting
    t.join(5)
    assert result["answer"].status_code == 200 and result["answer"].json() == {"slept": 1.0}
    assert r.proc.wait(5) == 0
    assert "stopped" in r.logs()[0]


# ---- standard library only --------------------------------------------------------------------------

def test_sdk_imports_only_the_standard_library():
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(SDK)!r})
        import levers9, levers9.app, levers9.runner
        from levers9 import App, Image, Secret
        app = App("check")
        third_party = sorted(
            name for name in sys.modules
            if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "levers9"
            and name not in sys.builtin_module_names and name != "__main__")
        third_party += sorted(n for n, m in list(sys.modules.items())
                              if "-packages" in str(getattr(m, "__file__", None) or ""))
        print(",".join(third_party))
    """)
    done = subprocess.run([sys.executable, "-S", "-I", "-c", code], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"third-party modules imported: {done.stdout}"
