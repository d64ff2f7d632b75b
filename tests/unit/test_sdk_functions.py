"""The SDK's Python functions (`@app.function`, .remote/.map/.spawn/.remote_gen, sessions) against a
FAKE of the gateway's function service (tests/unit/functions_fake.py) in this process."""

from __future__ import annotations

import _thread
import importlib
import itertools
import json
import signal
import sys
import threading
import time
import traceback

import msgspec
import pytest
from functions_fake import TOKEN, FakeFunctions
from typer.testing import CliRunner

from levers9 import (
    App,
    ArgumentError,
    AuthenticationError,
    ConfigError,
    Function,
    FunctionCall,
    FunctionNotFoundError,
    FunctionTimeoutError,
    PythonVersionError,
    RemoteError,
    function_calls,
    function_client,
    load_app_file,
)
from levers9.contracts.spec import FunctionOptions, decode_spec

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"

app = App("demo")


@app.function(cpu=1, memory="1Gi", timeout=60, retries=2, packages=["humanize"])
def square(x):
    return x * x


@app.function()
def inverse_sleep(x):
    time.sleep((5 - x) * 0.05)  # later inputs finish first
    return x * 10


@app.function()
def odd_fails(x):
    if x % 2:
        raise ValueError(f"odd {x}")
    time.sleep(0.5 if x > 2 else 0)  # still running when input 1 has failed
    return x


def helper_that_fails(x):
    raise KeyError(f"no such key {x}")


@app.function()
def fails(x):
    return helper_that_fails(x)


class Unloadable(Exception):
    """Unpickles only where the module `levers9_remote_only` exists, as a type of the sandbox's own."""

    def __reduce__(self):
        return (importlib.import_module, ("levers9_remote_only",))


@app.function()
def raises_unloadable():
    raise Unloadable("only the sandbox has this type")


@app.function()
def chatty(name):
    print("one")
    print("warning", file=sys.stderr)
    print(f"two {name}")
    return f"hello {name}"


@app.function()
def countdown(n):
    for i in range(n, 0, -1):
        yield i


@app.function()
def waits(seconds=3.0):
    print("started", flush=True)
    time.sleep(seconds)
    return "finished"


@app.function()
def size_of(data):
    return len(data)


@app.function()
def big_result(n):
    return b"y" * n


@pytest.fixture
def fake(capsys, monkeypatch, tmp_path):
    """The fake service, and the client pointed at it (LEVERS9_FUNCTIONS_URL, LEVERS9_TOKEN)."""
    server = FakeFunctions(PYTHON).start()
    monkeypatch.setenv("LEVERS9_HOME", str(tmp_path))
    monkeypatch.setenv("LEVERS9_FUNCTIONS_URL", server.address)
    monkeypatch.setenv("LEVERS9_TOKEN", TOKEN)
    monkeypatch.delenv("LEVERS9_GATEWAY_URL", raising=False)
    monkeypatch.delenv("LEVERS9_CA_FILE", raising=False)
    for fn in (square, inverse_sleep, odd_fails, fails, raises_unloadable, chatty, countdown, waits, size_of,
               big_result):
        fn._described = None  # each test describes afresh, against its own fake
    yield server
    function_client.close_channels()
    server.stop()


def wait_for(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


# ---- calls ---------------------------------------------------------------------------------------

def test_remote_returns_the_value_and_sends_the_function_by_value(fake):
    assert square(3) == 9  # here
    assert square.remote(7) == 49
    [hello] = fake.kinds("hello")
    assert hello.protocol == 1 and hello.mode == "call" and hello.python == PYTHON and hello.session_id == ""
    ref = hello.function
    assert (ref.app, ref.name, ref.retries, list(ref.packages), ref.generator) == ("demo", "square", 2,
                                                                                   ["humanize"], False)
    spec = json.loads(ref.spec_json)
    assert spec["code"]["kind"] == "function" and spec["resources"] == {"cpu_millicores": 1000, "memory_mib": 1024}
    assert "msgspec" in ref.imports and "pytest" in ref.imports and "sys" not in ref.imports
    assert "levers9" not in ref.imports
    assert [k for k, _ in fake.received] == ["describe", "hello", "input", "done"]


def test_map_yields_in_input_order_when_later_inputs_finish_first(fake):
    assert list(inverse_sleep.map(range(5))) == [0, 10, 20, 30, 40]
    assert fake.results_sent != sorted(fake.results_sent)  # the fake did answer out of order


def test_map_zips_several_iterables_and_starmap_spreads_tuples(fake):
    assert list(square.map([1, 2, 3])) == [1, 4, 9]
    add = App("demo").function(name="add")(lambda a, b: a + b)
    assert list(add.map([1, 2], [10, 20, 30])) == [11, 22]
    assert list(add.starmap([(1, 2), (3, 4)])) == [3, 7]
    assert sorted(add.map([1, 2, 3], [1, 1, 1], order_outputs=False)) == [2, 3, 4]
    assert list(square.map([])) == []


def test_map_with_return_exceptions_yields_them_in_place(fake):
    out = list(odd_fails.map(range(4), return_exceptions=True))
    assert out[0] == 0 and out[2] == 2
    assert isinstance(out[1], ValueError) and str(out[1]) == "odd 1"
    assert isinstance(out[3], ValueError) and "odd_fails" in out[3].remote_traceback


def test_map_raises_the_first_failure_and_cancels_the_rest(fake):
    with pytest.raises(ValueError, match="odd 1"):
        list(odd_fails.map(range(6)))
    assert wait_for(lambda: fake.kinds("cancel"))


def test_the_remote_exception_is_raised_as_its_own_type_with_the_remote_frames(fake):
    with pytest.raises(KeyError) as caught:
        fails.remote("k")
    text = "".join(traceback.format_exception(caught.value))
    assert "helper_that_fails" in text and "no such key k" in text
    assert "The above exception was the direct cause of the following exception" in text
    assert text.index("helper_that_fails") < text.index("The above exception")
    assert "helper_that_fails" in caught.value.remote_traceback


def test_an_exception_whose_type_is_not_here_becomes_a_remote_error(fake):
    with pytest.raises(RemoteError) as caught:
        raises_unloadable.remote()
    exc = caught.value
    assert exc.error_type.endswith("test_sdk_functions.Unloadable")
    assert exc.error == "only the sandbox has this type" and "raises_unloadable" in exc.remote_traceback
    assert "raises_unloadable" in "".join(traceback.format_exception(exc))


def test_prints_reach_stdout_and_stderr_in_order_before_the_value(fake, capsys):
    assert chatty.remote("ann") == "hello ann"
    captured = capsys.readouterr()
    assert captured.out == "one\ntwo ann\n"
    assert captured.err == "warning\n"


def test_spawn_then_get_and_from_id(fake):
    call = square.spawn(5)
    assert isinstance(call, FunctionCall) and call.id
    assert call.get(timeout=60) == 25
    assert FunctionCall.from_id(call.id).get() == 25
    assert [h.mode for h in fake.kinds("hello")] == ["spawn", "get", "get"]


def test_get_times_out_and_the_call_runs_on(fake):
    call = waits.spawn(1.0)
    with pytest.raises(FunctionTimeoutError, match="did not finish within 0.2 s; it runs on") as caught:
        call.get(timeout=0.2)
    assert isinstance(caught.value, TimeoutError)
    assert call.get(timeout=10) == "finished"
    assert not fake.kinds("cancel")


def test_remote_gen_streams_the_items(fake):
    assert list(countdown.remote_gen(3)) == [3, 2, 1]
    assert fake.kinds("hello")[0].function.generator
    with pytest.raises(TypeError, match="generator function: .remote cannot"):
        countdown.remote(3)


def test_a_session_id_goes_with_each_call_in_the_block_and_the_session_is_ended(fake):
    with app.session() as session:
        assert square.remote(2) == 4
        assert list(square.map([1, 2])) == [1, 4]
    square.remote(3)
    ids = [h.session_id for h in fake.kinds("hello")]
    assert ids == [session.id, session.id, ""] and len(session.id) == 36
    assert fake.kinds("end-session") == [session.id]


def test_a_session_without_calls_tells_the_gateway_nothing(fake):
    with App("other").session():
        square.remote(2)  # another app's function: not in the session
    assert fake.kinds("hello")[0].session_id == "" and not fake.kinds("end-session")


def test_a_python_mismatch_names_both_versions_before_any_call(fake):
    fake.python = "3.99"
    with pytest.raises(PythonVersionError) as caught:
        square.remote(2)
    message = str(caught.value)
    assert f"use Python 3.99 locally, or an image whose python3 is {PYTHON}" in message
    assert "runs on Python 3.99 but this is Python" in message
    assert not fake.kinds("hello")


def test_an_unpicklable_argument_fails_before_anything_is_sent(fake):
    lock = threading.Lock()
    with pytest.raises(ArgumentError, match=r"argument 2 of function square of app demo cannot be pickled: it "
                                            r"is a _thread.lock") as caught:
        square.remote(1, lock)
    assert isinstance(caught.value, TypeError)
    with pytest.raises(ArgumentError, match="keyword argument x of"):
        square.remote(x=lock)
    with pytest.raises(ArgumentError, match="argument 1 of input 0 of function square"):
        list(square.map([lock, 1]))
    assert fake.received == []


def test_ctrl_c_while_waiting_cancels_the_call(fake, monkeypatch):
    def interrupting(output):
        if "started" in output.text:
            raise KeyboardInterrupt

    monkeypatch.setattr(function_calls, "write_output", interrupting)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        waits.remote(30.0)
    assert wait_for(lambda: fake.kinds("cancel"))
    assert fake.kinds("cancel")[0].reason == "interrupted (Ctrl-C)"
    assert time.monotonic() - started < 20  # did not wait for the call (30 s)


def test_ctrl_c_from_a_signal_while_blocked_cancels_the_call(fake, monkeypatch):
    # the signal comes once the call runs (its output says so), while the caller waits for its result
    timer = threading.Timer(0.3, _thread.interrupt_main)
    shown = function_calls.write_output

    def start_timer_when_started(output):
        shown(output)
        if "started" in output.text and not timer.is_alive():
            timer.start()

    monkeypatch.setattr(function_calls, "write_output", start_timer_when_started)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever ran before
    try:
        with pytest.raises(KeyboardInterrupt):
            waits.remote(30.0)  # far longer than the timer, however loaded the machine
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, before)
    assert wait_for(lambda: fake.kinds("cancel"))


def test_map_pulls_a_bounded_number_of_inputs(fake, monkeypatch):
    monkeypatch.setattr(function_calls, "MAP_WINDOW", 8)
    fake.max_results = 20  # then this fake stops answering
    pulled = []

    def endless():
        for i in itertools.count():
            pulled.append(i)
            yield i

    results = square.map(endless())
    assert list(itertools.islice(results, 20)) == [i * i for i in range(20)]
    results.close()
    assert 20 <= len(pulled) <= 20 + 8 + 1
    assert wait_for(lambda: fake.kinds("cancel"))
    assert len(fake.kinds("input")) == len(pulled)


def test_a_large_input_is_uploaded_and_a_large_result_downloaded(fake):
    data = b"x" * (5 << 20)
    assert size_of.remote(data) == len(data)
    [upload] = fake.kinds("upload")
    assert upload.index == 0 and upload.size > 5 << 20
    [given] = fake.kinds("input")
    assert given.blob_key and not given.args
    assert len(fake.kinds("http-put")) == 1
    assert big_result.remote(5 << 20) == b"y" * (5 << 20)


# ---- lookup, errors, connection ------------------------------------------------------------------

def test_lookup_calls_a_deployed_function_by_name(fake):
    fake.deployed[("demo", "cube")] = lambda x: x ** 3
    cube = Function.lookup("demo", "cube")
    assert cube.remote(2) == 8
    ref = fake.kinds("hello")[0].function
    assert (ref.app, ref.name, ref.pickled, ref.spec_json) == ("demo", "cube", b"", "")
    with pytest.raises(TypeError, match="runs remotely only"):
        cube(2)


def test_lookup_of_a_missing_function_says_to_deploy_it(fake):
    with pytest.raises(FunctionNotFoundError, match=r"no function nope in app demo \(.*\): deploy it with "
                                                    r"`levers9 deploy FILE`"):
        Function.lookup("demo", "nope")


def test_a_refused_token_is_an_authentication_error(fake, monkeypatch):
    monkeypatch.setenv("LEVERS9_TOKEN", "wrong")
    with pytest.raises(AuthenticationError, match="UNAUTHENTICATED: this token is unknown or revoked: run "
                                                  "`levers9 up`"):
        square.remote(2)


def test_the_address_comes_from_the_gateways_info_without_functions_url(fake, monkeypatch):
    monkeypatch.delenv("LEVERS9_FUNCTIONS_URL")
    monkeypatch.setenv("LEVERS9_GATEWAY_URL", fake.http_base)
    assert square.remote(4) == 16
    target = function_client.resolve_target()
    assert (target.address, target.tls, target.token) == (fake.address, False, TOKEN)


def test_the_profile_names_the_address(fake, monkeypatch, tmp_path):
    monkeypatch.delenv("LEVERS9_FUNCTIONS_URL")
    monkeypatch.delenv("LEVERS9_TOKEN")
    (tmp_path / "config.toml").write_text(f'gateway_url = "https://gw.example"\ntoken = "{TOKEN}"\n'
                                          f'functions_url = "{fake.address}"\n')
    target = function_client.resolve_target()
    assert (target.address, target.tls, target.token) == (fake.address, True, TOKEN)  # https gateway: TLS


def test_no_gateway_known_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("LEVERS9_HOME", str(tmp_path))
    for name in ("LEVERS9_FUNCTIONS_URL", "LEVERS9_GATEWAY_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(function_client.GatewayUnavailableError, match="run `levers9 up`"):
        function_client.resolve_target()


# ---- the spec and the options --------------------------------------------------------------------

APP_FILE = '''
from levers9 import App, Image

app = App("calc")

@app.function(cpu=0.5, memory="512Mi", image=Image(python_packages=["numpy"]), retries=3,
              packages=["humanize==4.9.0"], max_containers=4, concurrency=2)
def square(x):
    return x * x

@app.function(name="count-down")
def count_down(n):
    yield from range(n, 0, -1)

@app.endpoint()
def hello():
    return {"ok": True}
'''


def test_load_app_file_emits_function_specs_that_decode(tmp_path):
    path = tmp_path / "calc.py"
    path.write_text(APP_FILE)
    specs = {s["name"]: s for s in load_app_file(path)}
    assert set(specs) == {"square", "count-down", "hello"}
    spec = specs["square"]
    assert spec["code"] == {"kind": "function", "module": "calc", "handler": "square"}
    assert spec["function"] == {"retries": 3, "packages": ["humanize==4.9.0"], "generator": False}
    decoded = decode_spec(json.dumps(spec))
    assert decoded.code.kind == "function" and decoded.resources.cpu_millicores == 500
    assert decoded.function == FunctionOptions(retries=3, packages=["humanize==4.9.0"])
    assert decoded.scaling.max_containers == 4 and decoded.image.python_packages == ["numpy"]
    gen = decode_spec(json.dumps(specs["count-down"]))
    assert gen.function.generator and gen.code.handler == "count_down"
    assert msgspec.to_builtins(decode_spec(json.dumps(specs["hello"])))["function"] is None


@pytest.mark.parametrize("options, message", [
    ({"retries": 11}, "retries 11 is not valid: use a whole number from 0 to 10"),
    ({"retries": True}, "retries True is not valid"),
    ({"packages": "humanize"}, "packages 'humanize' is not valid: use a list"),
    ({"packages": ["-r reqs.txt"]}, "packages item '-r reqs.txt' is not valid"),
    ({"packages": [3]}, "packages item 3 is not valid"),
    ({"packages": ["./local"]}, "packages item './local' is not valid"),
    ({"packages": ["a\nb"]}, "packages item 'a.*' is not valid"),
    ({"on_start": print}, "@app.function takes no on_start"),
    ({"cpu": "lots"}, "cpu 'lots' is not understood"),
])
def test_function_option_errors(options, message):
    def f():
        return 1

    with pytest.raises(ConfigError, match=message):
        App("bad").function(**options)(f)


def test_a_function_is_callable_here_and_pickles():
    import cloudpickle

    assert square(4) == 16 and square.__wrapped__(5) == 25 and square.__name__ == "square"
    copy = cloudpickle.loads(cloudpickle.dumps(square))
    assert copy(3) == 9 and copy.name == "square"


# ---- the CLI -------------------------------------------------------------------------------------

def test_levers9_run_calls_the_function_and_prints_json(fake, tmp_path):
    from levers9.cli import app as cli

    path = tmp_path / "calc.py"
    path.write_text(APP_FILE)
    runner = CliRunner()
    result = runner.invoke(cli, ["run", f"{path}::square", "-3", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == 9
    result = runner.invoke(cli, ["run", f"{path}::count-down", "n=2"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["2", "1"]
    result = runner.invoke(cli, ["run", f"{path}::nope"])
    assert result.exit_code == 1 and "calc.py has no @app.function named 'nope': it has count_down, square" in \
        result.output


def test_levers9_run_parses_literals_and_keywords():
    from levers9.cli_functions import parse_arguments

    assert parse_arguments(["3", "'a'", "hello world", "[1, 2]", "k={'a': 1}", "s=text"]) == (
        [3, "a", "hello world", [1, 2]], {"k": {"a": 1}, "s": "text"})


def test_levers9_with_functions_imports_with_the_standard_library_only(tmp_path):
    """Inside a container levers9 is mounted alone on a bare python3: defining functions (and even
    calling one locally) must import nothing else."""
    import shutil
    import subprocess
    from pathlib import Path

    import levers9

    shutil.copytree(Path(levers9.__file__).parent, tmp_path / "levers9")
    script = f"""
import sys
class NoThirdParty:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top not in sys.stdlib_module_names and top != "levers9":
            raise ImportError("not in a bare container: " + name)
sys.meta_path.insert(0, NoThirdParty())
sys.path.insert(0, {str(tmp_path)!r})
from levers9 import App, Function, FunctionCall, RemoteError
app = App("bare")

@app.function(retries=1, packages=["humanize"])
def double(x):
    return 2 * x

assert isinstance(double, Function) and double(4) == 8
assert app.specs()[0]["function"] == {{"retries": 1, "packages": ["humanize"], "generator": False}}
print("ok")
"""
    done = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr
