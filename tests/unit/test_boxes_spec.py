"""Boxes in the spec and the SDK: bad input first (a port outside 1..65535, an empty command, NUL in an
argument, a box without its options or an endpoint with them) is refused with a sentence naming the
field, by the SDK where the user wrote it and again by the gateway's decoder; then what a good
`app.box(...)` sends decodes to the values it names."""

from __future__ import annotations

import json
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9 import App, ConfigError, Image, load_app_file
from levers9.contracts.autoscaling import governed
from levers9.contracts.spec import BoxOptions, InvalidSpec, decode_spec

WEB = ["python3", "-m", "http.server", "8000"]


def box_spec(**box) -> dict:
    return {"name": "web", "code": {"kind": "box", "module": "", "handler": ""},
            "box": {"command": WEB, "port": 8000, **box}}


def refusal(doc: dict) -> str:
    with pytest.raises(InvalidSpec) as err:
        decode_spec(json.dumps(doc))
    return str(err.value)


# ---- hostile and bad input: the gateway's decoder ------------------------------------------------

@given(st.one_of(st.integers(max_value=0), st.integers(min_value=65536)))
def test_a_port_outside_1_to_65535_is_refused_naming_the_field(port):
    assert "$.box.port" in refusal(box_spec(port=port))


@given(st.one_of(st.none(), st.text(max_size=5), st.booleans().map(lambda b: str(b)),
                 st.floats(allow_nan=False, allow_infinity=False)))
def test_a_port_that_is_no_integer_is_refused(port):
    assert "$.box.port" in refusal(box_spec(port=port))


def test_an_empty_command_is_refused_naming_the_field():
    assert "$.box.command" in refusal(box_spec(command=[]))
    assert "command" in refusal(box_spec(command=["  ", "x"]))
    assert "$.box.command" in refusal(box_spec(command="python3 -m http.server"))  # a string is no argv


def test_nul_overlong_and_too_many_arguments_are_refused():
    assert "$.box.command[1]" in refusal(box_spec(command=["sh", "a\x00b"]))
    assert "$.box.command[0]" in refusal(box_spec(command=["x" * 8193]))
    assert "$.box.command" in refusal(box_spec(command=["x"] * 257))


@pytest.mark.parametrize("path", ["health", "/with space", "/tab\t", "", "/" + "a" * 2048, "/\u00e9"])
def test_a_ready_path_that_is_no_absolute_plain_path_is_refused(path):
    assert "$.box.ready_path" in refusal(box_spec(ready_path=path))


def test_a_box_needs_its_options_and_only_a_box_has_them():
    doc = box_spec()
    del doc["box"]
    assert "box" in refusal(doc)
    endpoint = {"name": "hello", "code": {"module": "app", "handler": "hello"}, "box": {"command": WEB, "port": 1}}
    assert "only a box" in refusal(endpoint)


# ---- hostile and bad input: the SDK ----------------------------------------------------------------

@pytest.mark.parametrize("command", ["python3 -m http.server", [], None, [""], ["sh", 3], ["sh", "a\x00"],
                                     ["x"] * 257, ("   ",), ["sh", "\ud800"]])
def test_the_sdk_refuses_a_bad_command_saying_how_to_fix_it(command):
    with pytest.raises(ConfigError, match="command"):
        App("a").box("web", command=command, port=8000)


@given(st.one_of(st.integers(max_value=0), st.integers(min_value=65536), st.booleans(), st.text(max_size=4),
                 st.floats()))
def test_the_sdk_refuses_a_port_outside_1_to_65535(port):
    with pytest.raises(ConfigError, match="port"):
        App("a").box("web", command=WEB, port=port)


def test_the_sdk_refuses_a_bad_name_ready_path_or_runner_option():
    with pytest.raises(ConfigError, match="box name"):
        App("a").box("Web_1", command=WEB, port=8000)
    with pytest.raises(ConfigError, match="ready_path"):
        App("a").box("web", command=WEB, port=8000, ready_path="health")
    with pytest.raises(ConfigError, match="on_start"):
        App("a").box("web", command=WEB, port=8000, on_start=print)
    app = App("a")
    app.box("web", command=WEB, port=8000)
    with pytest.raises(ConfigError, match="already has"):
        app.box("web", command=WEB, port=8001)


# ---- what a good box sends ---------------------------------------------------------------------------

@given(st.integers(min_value=1, max_value=65535),
       st.lists(st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=20),
                max_size=5))
def test_any_port_and_argv_round_trips_through_the_sdk_and_the_decoder(port, args):
    app = App("a")
    app.box("web", command=["prog", *args], port=port)
    [spec] = app.specs()
    decoded = decode_spec(json.dumps(spec))
    assert decoded.box == BoxOptions(command=["prog", *args], port=port)
    assert decoded.code.kind == "box" and governed(decoded)  # the autoscaler scales boxes like endpoints


def test_a_box_takes_the_options_of_an_endpoint():
    app = App("a")
    app.box("files", command=WEB, port=8000, ready_path="/health?deep=1", image=Image(apt_packages=["curl"]),
            cpu=0.5, memory="256Mi", env={"MODE": "x"}, secrets=["API_KEY"], keep_warm_seconds=5,
            min_containers=1, checkpoint_enabled=True, timeout=20)
    spec = decode_spec(json.dumps(app.specs()[0]))
    assert spec.box == BoxOptions(command=WEB, port=8000, ready_path="/health?deep=1")
    assert (spec.resources.cpu_millicores, spec.resources.memory_mib, spec.timeout_seconds) == (500, 256, 20)
    assert spec.checkpoint_enabled and spec.scaling.keep_warm_seconds == 5 and spec.scaling.min_containers == 1
    assert spec.env == {"MODE": "x"} and spec.secrets == ["API_KEY"] and spec.image is not None


def test_load_app_file_returns_boxes_beside_endpoints(tmp_path):
    (tmp_path / "site_app.py").write_text(textwrap.dedent("""
        from levers9 import App
        app = App("site")
        app.box("files", command=["python3", "-m", "http.server", "8000"], port=8000)

        @app.endpoint()
        def hello():
            return "hi"
    """))
    specs = {s["name"]: s for s in load_app_file(tmp_path / "site_app.py")}
    assert specs["files"]["code"] == {"kind": "box", "module": "", "handler": ""}
    assert specs["files"]["box"] == {"command": WEB, "port": 8000}
    assert specs["hello"]["code"]["handler"] == "hello"
