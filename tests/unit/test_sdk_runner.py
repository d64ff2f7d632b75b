"""The runner's pure parts, without a process: its configuration from the environment, how a
request's query and body become an endpoint function's keyword arguments, what counts as an ASGI app."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.runner.config import Config
from levers9.runner.endpoint import BadRequest, inputs
from levers9.runner.runtime import is_asgi

BASE = {"LEVERS9_RUNNER_MODULE": "app", "LEVERS9_RUNNER_HANDLER": "f"}


def test_config_defaults_and_values():
    assert Config.from_env(BASE) == Config(module="app", handler="f")
    env = {**BASE, "LEVERS9_RUNNER_KIND": "asgi", "LEVERS9_RUNNER_PORT": "9000", "LEVERS9_RUNNER_CONCURRENCY": "4",
           "LEVERS9_RUNNER_TIMEOUT": "1.5", "LEVERS9_RUNNER_ON_START": " load ", "LEVERS9_RUNNER_HOST": ""}
    assert Config.from_env(env) == Config(module="app", handler="f", kind="asgi", port=9000, concurrency=4,
                                          timeout=1.5, on_start="load")


@pytest.mark.parametrize("env, message", [
    ({}, "LEVERS9_RUNNER_MODULE and LEVERS9_RUNNER_HANDLER must name"),
    ({**BASE, "LEVERS9_RUNNER_KIND": "wsgi"}, "LEVERS9_RUNNER_KIND='wsgi' is not valid: use endpoint or asgi"),
    ({**BASE, "LEVERS9_RUNNER_CONCURRENCY": "0"}, "LEVERS9_RUNNER_CONCURRENCY='0' is not valid"),
    ({**BASE, "LEVERS9_RUNNER_PORT": "http"}, "LEVERS9_RUNNER_PORT='http' is not valid"),
    ({**BASE, "LEVERS9_RUNNER_TIMEOUT": "-1"}, "use a number of at least 0"),
])
def test_config_errors_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Config.from_env(env)


keys = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=8)
values = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10), st.lists(st.integers(), max_size=3))


@given(st.dictionaries(keys, st.text(max_size=10), max_size=4), st.dictionaries(keys, values, max_size=4))
def test_query_parameters_then_body_fields(query, body):
    got = inputs(urlencode(query), json.dumps(body).encode() if body else b"")
    assert got == {**query, **body}  # the body's field wins over a query parameter of the same name


@given(keys, st.lists(st.text(max_size=5), min_size=2, max_size=4))
def test_a_repeated_query_parameter_is_a_list(key, repeated):
    assert inputs(urlencode([(key, v) for v in repeated]), b"  ") == {key: repeated}


@pytest.mark.parametrize("body, status, message", [
    (b"{nope", 400, "the body is not JSON"),
    (b"[1, 2]", 400, "the body is a JSON list, not an object"),
    (b"\xff", 400, "the body is not JSON"),
    (b'{"a": "\xff\xfe"}', 400, "not UTF-8: an invalid byte at offset 7"),
    (b"[" * 10_000 + b"]" * 10_000, 400, "nests deeper than 100 levels"),  # a RecursionError dropped the connection
    (b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}", 400, "nests deeper than 100 levels"),
])
def test_bodies_that_are_not_a_json_object(body, status, message):
    with pytest.raises(BadRequest, match=message) as e:
        inputs("", body)
    assert e.value.status == status


def test_what_counts_as_an_asgi_app():
    async def app(scope, receive, send):
        pass

    class AsgiObject:
        async def __call__(self, scope, receive, send):
            pass

    class Plain:
        def __call__(self):
            pass

    def factory():
        return app

    assert is_asgi(app) and is_asgi(AsgiObject())
    assert not is_asgi(factory) and not is_asgi(Plain()) and not is_asgi(AsgiObject) and not is_asgi(42)
