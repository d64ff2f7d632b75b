"""The SDK: option parsing, specs, ConfigError messages, load_app_file, code packaging, the client's
errors and the deploy command against a fake gateway."""

from __future__ import annotations

import io
import json
import socket
import tarfile
import textwrap
from pathlib import Path

import httpx
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9 import App, Image, Secret
from levers9.app import SPEC_KEYS, ConfigError, load_app_file, parse_cpu, parse_gpu, parse_memory
from levers9.client import MAX_CODE_BYTES, Client, ClientError, code_files, package_code
from levers9.contracts.spec import ImageSpec, decode_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture(autouse=True)
def restore_import_state(tmp_path_factory):
    """load_app_file puts the app's directory on sys.path and its modules in sys.modules."""
    import sys

    path, temp = list(sys.path), str(tmp_path_factory.getbasetemp())
    yield
    sys.path[:] = path
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(temp):
            del sys.modules[name]


# ---- memory, cpu, gpu ------------------------------------------------------------------------------

@given(st.integers(min_value=16, max_value=10**7))
def test_memory_as_mib(n):
    assert parse_memory(n) == n
    assert parse_memory(f"{n}Mi") == n
    assert parse_memory(f"{n}M") == n
    assert parse_memory(str(n)) == n


@given(st.integers(min_value=1, max_value=4096))
def test_memory_gib(n):
    assert parse_memory(f"{n}Gi") == n * 1024
    assert parse_memory(f"{n}G") == n * 1024


@pytest.mark.parametrize("value, mib", [("1.5Gi", 1536), ("16.5Mi", 17), ("1Ti", 1024 * 1024), (" 512Mi ", 512),
                                        (2048.0, 2048)])
def test_memory_forms(value, mib):
    assert parse_memory(value) == mib


@pytest.mark.parametrize("value", ["2GB", "512mb", "lots", "", "-1Gi", "1 Gi", True, None, 1.5, [512]])
def test_memory_not_understood(value):
    with pytest.raises(ConfigError, match="is not understood: use MiB as a number or a string like '512Mi' or '2Gi'"):
        parse_memory(value)


def test_memory_message_is_the_documented_sentence():
    with pytest.raises(ConfigError) as e:
        parse_memory("2GB")
    assert str(e.value) == ("memory '2GB' is not understood: use MiB as a number or a string like '512Mi' "
                            "or '2Gi'")


@pytest.mark.parametrize("value", [0, -5, "0Mi", 15, "8Mi"])
def test_memory_too_small(value):
    with pytest.raises(ConfigError, match="too small: ask for at least 16 MiB"):
        parse_memory(value)


@given(st.floats(min_value=0.001, max_value=1024, allow_nan=False))
def test_cpu_cores_to_millicores(cores):
    assert parse_cpu(cores) == round(cores * 1000)


@given(st.integers(min_value=1, max_value=10**6))
def test_cpu_millicore_strings(m):
    assert parse_cpu(f"{m}m") == m


@pytest.mark.parametrize("value, millis", [(1, 1000), (0.5, 500), ("2", 2000), ("0.25", 250), ("500m", 500)])
def test_cpu_forms(value, millis):
    assert parse_cpu(value) == millis


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "half", "1 core", True, None, "0.0001"])
def test_cpu_invalid(value):
    with pytest.raises(ConfigError, match="cpu"):
        parse_cpu(value)


@given(st.lists(st.sampled_from(["T4", "L4", "A10G", "A100", "A100-80", "H100", "L40S"]), min_size=1))
def test_gpu_preference_keeps_order_without_duplicates(names):
    got = parse_gpu(names)
    assert got == list(dict.fromkeys(names))


def test_gpu_forms():
    assert parse_gpu(None) == []
    assert parse_gpu("T4") == ["T4"]
    assert parse_gpu(("H100", "A100")) == ["H100", "A100"]
    for bad in ([], "", "not a gpu!", 4, ["T4", 3]):
        with pytest.raises(ConfigError, match="gpu"):
            parse_gpu(bad)


def test_gpu_count_defaults():
    app = App("gpus")

    @app.endpoint(gpu="T4")
    def one():
        pass

    @app.endpoint(gpu=["H100", "A100"], gpu_count=2)
    def two():
        pass

    @app.endpoint(gpu_count=1)  # any GPU type
    def any_gpu():
        pass

    @app.endpoint()
    def none():
        pass

    specs = {s["name"]: decode_spec(json.dumps(s)).resources for s in app.specs()}
    assert (specs["one"].gpu, specs["one"].gpu_count) == (["T4"], 1)
    assert (specs["two"].gpu, specs["two"].gpu_count) == (["H100", "A100"], 2)
    assert (specs["any-gpu"].gpu, specs["any-gpu"].gpu_count) == ([], 1)
    assert (specs["none"].gpu, specs["none"].gpu_count) == ([], 0)
    with pytest.raises(ConfigError, match="gpu_count=0 asks for no GPU"):
        app.endpoint(name="zero", gpu="T4", gpu_count=0)(lambda: None)


# ---- specs ------------------------------------------------------------------------------------------

def load():
    return 1


def test_spec_has_exactly_the_documented_keys_and_defaults():
    app = App("demo-1")

    @app.endpoint()
    def handler(x: int = 1):
        return x * 2

    [spec] = app.specs()
    # only what the SDK works out; DeploymentSpec's defaults fill in the rest
    assert spec == {"name": "handler", "app_name": "demo-1",
                    "code": {"kind": "endpoint", "module": __name__, "handler": "handler"}}
    assert set(spec) <= set(SPEC_KEYS)
    assert msgspec.to_builtins(decode_spec(json.dumps(spec))) == {
        "name": "handler", "app_name": "demo-1",
        "code": {"kind": "endpoint", "module": __name__, "handler": "handler", "on_start": "", "sha256": "",
                 "key": ""},
        "image": None, "image_ref": None,
        "resources": {"cpu_millicores": 1000, "memory_mib": 1024, "gpu": [], "gpu_count": 0},
        "scaling": {"keep_warm_seconds": 60, "min_containers": 0, "max_containers": 1, "concurrency": 1,
                    "max_pending": 1000, "buffer_containers": 0, "target_concurrency": 0, "scaledown_window": None,
                    "warm_schedule": {}, "warm_schedule_timezone": "UTC"},
        "timeout_seconds": 180, "secrets": [], "env": {}, "checkpoint_enabled": False, "pool": "default",
        "function": None, "volumes": [], "buckets": [], "task_queue": None, "schedule": None, "box": None,
        "sandbox": None}
    assert handler(x=3) == 6  # still callable locally


def test_spec_with_every_option():
    app = App("full")
    image = Image(python_packages=["numpy==2.1.0"], commands=["apt-get update"])

    @app.asgi(name="web", cpu="250m", memory="2Gi", gpu=["H100", "A100"], image=image, keep_warm_seconds=5,
              min_containers=1, max_containers=3, concurrency=8, timeout=30,
              secrets=["API_KEY", Secret("DB_URL"), "API_KEY"], env={"MODE": "prod"}, on_start=load,
              checkpoint_enabled=True, pool="gpu-pool")
    def make_app():
        async def asgi(scope, receive, send):
            pass
        return asgi

    [spec] = app.specs()
    code, res, scale = spec["code"], spec["resources"], spec["scaling"]
    assert code["kind"] == "asgi" and code["handler"] == "make_app" and code["on_start"] == "load"
    assert (res["cpu_millicores"], res["memory_mib"], res["gpu"], res["gpu_count"]) == (250, 2048,
                                                                                      ["H100", "A100"], 1)
    assert spec["image"] == {"python_packages": ["numpy==2.1.0"], "commands": ["apt-get update"]}
    assert spec["secrets"] == ["API_KEY", "DB_URL"] and spec["env"] == {"MODE": "prod"}
    assert (scale["min_containers"], scale["max_containers"], scale["concurrency"], spec["timeout_seconds"],
            scale["keep_warm_seconds"], spec["checkpoint_enabled"], spec["pool"]) == (1, 3, 8, 30, 5, True,
                                                                                      "gpu-pool")
    got = decode_spec(json.dumps(spec))  # what the gateway receives is JSON
    decoded = msgspec.to_builtins(got)
    assert decoded.items() >= {k: v for k, v in spec.items() if k not in ("code", "image", "scaling")}.items()
    assert decoded["scaling"].items() >= spec["scaling"].items()  # the rest are Scaling's defaults
    assert got.image == ImageSpec(python_packages=["numpy==2.1.0"], commands=["apt-get update"])


def test_default_names_follow_the_url_rule():
    app = App("names")

    @app.endpoint
    def say_hello():
        pass

    [spec] = app.specs()
    assert (spec["name"], spec["code"]["handler"]) == ("say-hello", "say_hello")
    with pytest.raises(ConfigError, match="endpoint name 'say_hello' is not valid: .* e.g. 'say-hello'"):
        app.endpoint(name="say_hello")(say_hello)


def test_decorator_without_parentheses_and_specs_are_copies():
    app = App("bare")

    @app.endpoint
    def f():
        return "ok"

    assert f() == "ok"
    app.specs()[0]["code"]["handler"] = "g"
    assert app.specs()[0]["code"]["handler"] == "f"


@pytest.mark.parametrize("name, hint", [("Hello", "'hello'"), ("my_app", "'my-app'"), ("-x", "'x'"), ("", None),
                                        ("a" * 64, None)])
def test_app_name_errors(name, hint):
    with pytest.raises(ConfigError, match="lowercase letters, digits and '-'") as e:
        App(name)
    if hint:
        assert hint in str(e.value)


@pytest.mark.parametrize("options, message", [
    ({"memory": "2GB"}, "memory '2GB' is not understood"),
    ({"cpu": "lots"}, "cpu 'lots' is not understood"),
    ({"on_start": lambda: 1}, "defined at the top level"),
    ({"on_start": "load"}, "on_start 'load' is not valid"),
    ({"env": {"1X": "a"}}, "env name '1X' is not valid"),
    ({"env": {"PORT": 8080}}, "write it as one, e.g. '8080'"),
    ({"env": {"LEVERS9_RUNNER_PORT": "1"}}, "reserved"),
    ({"secrets": "API_KEY"}, "use a list of names"),
    ({"secrets": ["bad-name"]}, "secret name 'bad-name' is not valid"),
    ({"min_containers": 3, "max_containers": 2}, "raise max_containers to at least 3"),
    ({"concurrency": 0}, "concurrency 0 is not valid"),
    ({"timeout": 1.5}, "timeout 1.5 is not valid"),
    ({"keep_warm_seconds": -1}, "keep_warm_seconds -1 is not valid"),
    ({"image": "python:3.11"}, "use Image("),
    ({"checkpoint_enabled": "yes"}, "use True or False"),
    ({"pool": "GPU pool"}, "pool 'GPU pool' is not valid"),
    ({"name": "Bad Name"}, "endpoint name 'Bad Name' is not valid"),
])
def test_option_errors_say_how_to_fix(options, message):
    app = App("errors")
    with pytest.raises(ConfigError) as e:
        app.endpoint(**options)(load)
    assert message in str(e.value)
    assert ":" in str(e.value)  # what is wrong: how to fix it


def test_nested_on_start_and_duplicate_names_are_refused():
    app = App("dup")

    def nested():
        pass

    with pytest.raises(ConfigError, match="top level"):
        app.endpoint(on_start=nested)(load)
    app.endpoint(name="x")(load)
    with pytest.raises(ConfigError, match="already has an endpoint named 'x'"):
        app.endpoint(name="x")(load)
    with pytest.raises(ConfigError, match="Image python_packages"):
        Image(python_packages="numpy")


# ---- load_app_file ----------------------------------------------------------------------------------

def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_load_hello_example():
    [spec] = load_app_file(EXAMPLES / "hello.py")
    assert spec["name"] == "hello" and spec["app_name"] == "hello"
    code = spec["code"]
    assert (code["module"], code["handler"], code["on_start"]) == ("hello", "hello", "load")
    assert (spec["resources"]["cpu_millicores"], spec["resources"]["memory_mib"],
            spec["scaling"]["keep_warm_seconds"]) == (500, 256, 30)
    assert code["kind"] == "endpoint"


def test_load_asgi_example():
    [spec] = load_app_file(EXAMPLES / "asgi_app.py")
    code = spec["code"]
    assert (code["kind"], spec["name"], code["module"], code["handler"]) == ("asgi", "asgi-demo", "asgi_app", "web")


def test_load_missing_and_not_python(tmp_path):
    with pytest.raises(ConfigError, match="there is no file .*nope.py: check the path"):
        load_app_file(tmp_path / "nope.py")
    with pytest.raises(ConfigError, match="not a Python file"):
        load_app_file(write(tmp_path / "app.txt", "x"))


def test_load_syntax_error_names_the_line(tmp_path):
    f = write(tmp_path / "broken_syntax.py", """\
        from levers9 import App
        app = App("x")
        def f(:
            pass
        """)
    with pytest.raises(ConfigError) as e:
        load_app_file(f)
    assert "broken_syntax.py line 3" in str(e.value) and "SyntaxError" in str(e.value)
    assert "fix the syntax" in str(e.value)


def test_load_import_error_names_the_exception_and_line(tmp_path):
    f = write(tmp_path / "broken_import.py", """\
        from levers9 import App
        import no_such_module_levers9
        app = App("x")
        """)
    with pytest.raises(ConfigError) as e:
        load_app_file(f)
    msg = str(e.value)
    assert "broken_import.py line 2: import no_such_module_levers9" in msg
    assert "ModuleNotFoundError: No module named 'no_such_module_levers9'" in msg


def test_load_error_raised_in_a_helper_module(tmp_path):
    write(tmp_path / "helper.py", "def boom():\n    raise RuntimeError('helper failed')\n")
    f = write(tmp_path / "main_app.py", "import helper\nhelper.boom()\n")
    with pytest.raises(ConfigError, match=r"helper.py line 2.*RuntimeError: helper failed"):
        load_app_file(f)


def test_load_config_error_at_import_names_the_line(tmp_path):
    f = write(tmp_path / "bad_memory.py", """\
        from levers9 import App
        app = App("x")
        @app.endpoint(memory="2GB")
        def f():
            pass
        """)
    with pytest.raises(ConfigError, match=r"bad_memory.py line 3.*memory '2GB' is not understood"):
        load_app_file(f)


def test_load_no_app_and_no_endpoint(tmp_path):
    with pytest.raises(ConfigError, match="defines no levers9 App: add `app = App"):
        load_app_file(write(tmp_path / "plain.py", "x = 1\n"))
    with pytest.raises(ConfigError, match="defines App 'empty' but no endpoint"):
        load_app_file(write(tmp_path / "empty_app.py", "from levers9 import App\napp = App('empty')\n"))


def test_load_refuses_names_the_container_cannot_import(tmp_path):
    with pytest.raises(ConfigError, match="rename it to my_app.py"):
        load_app_file(write(tmp_path / "my-app.py", "x = 1\n"))
    with pytest.raises(ConfigError, match="rename it, e.g. to json_app.py"):
        load_app_file(write(tmp_path / "json.py", "x = 1\n"))


def test_load_refuses_a_handler_not_reachable_by_name(tmp_path):
    f = write(tmp_path / "nested.py", """\
        from levers9 import App
        app = App("x")
        def make():
            @app.endpoint(name="inner")
            def inner():
                pass
        make()
        """)
    with pytest.raises(ConfigError, match="cannot be found by name in nested.py"):
        load_app_file(f)


def test_load_finds_an_asgi_object_by_its_variable(tmp_path):
    f = write(tmp_path / "objapp.py", """\
        from levers9 import App
        app = App("objapp")
        class Web:
            async def __call__(self, scope, receive, send):
                pass
        web = app.asgi(name="web")(Web())
        """)
    [spec] = load_app_file(f)
    assert (spec["code"]["module"], spec["code"]["handler"], spec["code"]["kind"]) == ("objapp", "web", "asgi")


def test_load_reads_changes_again(tmp_path):
    write(tmp_path / "util.py", "MEM = '256Mi'\n")
    f = write(tmp_path / "reloaded.py", """\
        from levers9 import App
        from util import MEM
        app = App("r")
        @app.endpoint(memory=MEM)
        def f():
            pass
        """)
    assert load_app_file(f)[0]["resources"]["memory_mib"] == 256
    write(tmp_path / "util.py", "MEM = '1Gi'\n")
    assert load_app_file(f)[0]["resources"]["memory_mib"] == 1024


# ---- packaging ----------------------------------------------------------------------------------------

def members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_package_takes_py_files_and_skips_the_rest(tmp_path):
    write(tmp_path / "app.py", "print('app')\n")
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "util.py", "X = 1\n")
    write(tmp_path / "data.csv", "a,b\n")
    write(tmp_path / ".hidden.py", "x\n")
    write(tmp_path / ".git" / "hook.py", "x\n")
    write(tmp_path / ".venv" / "lib" / "site.py", "x\n")
    write(tmp_path / "env" / "pyvenv.cfg", "home = /usr\n")
    write(tmp_path / "env" / "lib" / "mod.py", "x\n")
    write(tmp_path / "pkg" / "__pycache__" / "util.cpython-311.py", "x\n")
    write(tmp_path / "node_modules" / "x.py", "x\n")
    archive = package_code(tmp_path)
    got = members(archive)
    assert sorted(got) == ["app.py", "pkg/__init__.py", "pkg/util.py"]
    assert got["pkg/util.py"] == b"X = 1\n"
    assert [p.relative_to(tmp_path).as_posix() for p in code_files(tmp_path)] == sorted(got)


def test_package_is_reproducible(tmp_path):
    write(tmp_path / "app.py", "x = 1\n")
    first = package_code(tmp_path)
    (tmp_path / "app.py").touch()
    assert package_code(tmp_path) == first


def test_package_size_limit(tmp_path):
    import random

    rng = random.Random(7)
    write(tmp_path / "big.py", "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(200_000)))
    write(tmp_path / "small.py", "x = 1\n")
    with pytest.raises(ClientError, match=r"over the limit of 64.0 KiB compressed \(largest files: big.py"):
        package_code(tmp_path, limit=64 * 1024)
    assert len(package_code(tmp_path)) < MAX_CODE_BYTES


# ---- the client -----------------------------------------------------------------------------------

def fake_gateway(handler):
    return Client("http://gateway.test", "tok", transport=httpx.MockTransport(handler))


def test_deploy_sends_spec_and_code_as_multipart():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["auth"] = request.headers["authorization"]
        seen["path"] = request.url.path
        seen["type"] = request.headers["content-type"]
        seen["body"] = request.read()
        return httpx.Response(201, json={"deployment_id": "d1", "name": "hello", "version": 3, "url": "/endpoint/hello"})

    c = fake_gateway(handler)
    answer = c.deploy({"name": "hello"}, b"\x1f\x8bcode")
    assert answer["version"] == 3
    assert seen["auth"] == "Bearer tok" and seen["path"] == "/api/v1/deployments"
    assert seen["type"].startswith("multipart/form-data")
    assert b'name="spec"' in seen["body"] and b'{"name": "hello"}' in seen["body"]
    assert b'name="code"; filename="code.tar.gz"' in seen["body"] and b"\x1f\x8bcode" in seen["body"]
    assert c.invocation_url("hello") == "http://gateway.test/endpoint/hello"


@pytest.mark.parametrize("status, detail, expected", [
    (401, "invalid token", "the gateway answered 401 Unauthorized: invalid token: run `levers9 up` or set LEVERS9_TOKEN"),
    (404, "no deployment 'x'", "check the name or id with `levers9 deployments list`"),
    (500, "boom", "see the gateway's log"),
    (422, [{"loc": ["body", "spec"], "msg": "field required"}], "spec: field required"),
])
def test_errors_are_sentences_with_the_fix(status, detail, expected):
    c = fake_gateway(lambda r: httpx.Response(status, json={"detail": detail}))
    with pytest.raises(ClientError) as e:
        c.stop_deployment("x")
    assert expected in str(e.value) and e.value.status == status
    assert str(e.value).startswith("stopping deployment 'x' failed")


def test_connection_refused_says_to_check_levers9():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = Client(f"http://127.0.0.1:{port}", "tok")
    with pytest.raises(ClientError, match=r"cannot reach the gateway.*is levers9 running\? `levers9 status`"):
        c.list_deployments()
    with pytest.raises(ClientError, match="no gateway is known"):
        Client("", "")


def test_logs_stream_and_lists():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/logs"):
            assert request.url.params.get("follow") == "true"
            return httpx.Response(200, content=b"line 1\nline 2\n", headers={"content-type": "text/plain"})
        return httpx.Response(200, json=[{"container_id": "c1", "status": "ready"}])

    c = fake_gateway(handler)
    assert "".join(c.container_logs("c1", follow=True)) == "line 1\nline 2\n"
    assert c.list_containers() == [{"container_id": "c1", "status": "ready"}]


# ---- the CLI ----------------------------------------------------------------------------------------

@pytest.fixture
def cli(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from levers9 import cli_app
    from levers9.cli import app

    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if request.url.path == "/api/v1/deployments" and request.method == "POST":
            return httpx.Response(201, json={"deployment_id": "d1", "name": "hello", "version": 1, "url": ""})
        if request.url.path == "/api/v1/deployments":
            return httpx.Response(200, json=[{"deployment_id": "d1", "name": "hello", "version": 1,
                                              "status": "active", "created_at": "2026-01-01T00:00:00Z"}])
        return httpx.Response(401, json={"detail": "invalid token"})

    monkeypatch.setattr(cli_app, "client", lambda: fake_gateway(handler))
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args)), calls


def test_cli_deploy_prints_name_version_and_url(cli):
    invoke, calls = cli
    result = invoke("deploy", str(EXAMPLES / "hello.py"))
    assert result.exit_code == 0, result.output
    assert "deployed hello version 1: http://gateway.test/endpoint/hello" in result.stdout
    assert len(calls) == 1 and b'"on_start": "load"' in calls[0].read()


def test_cli_lists_as_json_and_errors_without_tracebacks(cli, tmp_path):
    invoke, _ = cli
    result = invoke("deployments", "list", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)[0]["name"] == "hello"
    result = invoke("secret", "list")
    assert result.exit_code == 1
    assert "error: listing secrets failed" in result.output and "LEVERS9_TOKEN" in result.output
    assert "Traceback" not in result.output
    result = invoke("deploy", str(write(tmp_path / "plain.py", "x = 1\n")))
    assert result.exit_code == 1 and "error: plain.py defines no levers9 App" in result.output


def test_scaling_options_and_their_refusals_name_the_field():
    app = App("scaled")

    @app.endpoint(min_containers=1, max_containers=4, buffer_containers=1, concurrency=8, target_concurrency=4,
                  scaledown_window=30, warm_schedule={"0 8 * * 1-5": 2, "0 19 * * 1-5": 0},
                  warm_schedule_timezone="Europe/Berlin")
    def web():
        return 1

    [spec] = app.specs()
    got = decode_spec(json.dumps(spec)).scaling
    assert (got.buffer_containers, got.target, got.window, got.warm_schedule_timezone) == (1, 4, 30, "Europe/Berlin")
    refused = {
        "warm_schedule": dict(warm_schedule={"0 25 * * *": 1}),
        "warm_schedule_timezone": dict(warm_schedule_timezone="Mars/Olympus"),
        "min_containers": dict(min_containers=2),
        "target_concurrency": dict(target_concurrency=2),
        "buffer_containers": dict(buffer_containers=2),
        "scaledown_window": dict(scaledown_window=5, keep_warm_seconds=6),
    }
    for i, (field, options) in enumerate(refused.items()):
        with pytest.raises(ConfigError, match=field):
            app.endpoint(name=f"bad-{i}", **options)(web)
