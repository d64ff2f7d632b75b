"""Settings: grouped and typed in code, one flat name outside (LEVERS9_<NAME>, profile <name>);
the round trip through a child's environment, validation, unknown variables, precedence."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from settings_strategies import settings_values

from levers9.runtime.config import (
    NOT_SETTINGS,
    PROFILE_CREDENTIALS,
    ContainerPeers,
    Criu,
    RuntimeKind,
    SettingError,
    Settings,
    unknown_warning,
)

ROOT = Path(__file__).resolve().parents[2]


def test_every_setting_has_one_flat_name_and_one_place():
    specs = Settings.specs()
    assert len(specs) == len(set(Settings.names())) == len(set(Settings.env_names()))
    assert Settings.env_names() == [f"LEVERS9_{n.upper()}" for n in Settings.names()]
    places = {(s.group, s.attr) for s in specs.values()}
    assert len(places) == len(specs)
    s = Settings()
    assert s.get("nats_url") is s.bus.nats_url and s.get("worker_criu") is Criu.AUTO and s.get("registry") == ""
    assert not set(NOT_SETTINGS) & set(Settings.env_names())


@settings(max_examples=60, deadline=None)
@given(settings_values())
def test_a_child_loads_the_settings_it_was_given(values):
    s = Settings().with_(home="/tmp/levers9-home", **values)
    env = s.as_env()
    assert all(k.startswith("LEVERS9_") and isinstance(v, str) for k, v in env.items())
    assert Settings.load(env=env, profile=Path("/nonexistent/config.toml")) == s


def test_values_are_typed():
    s = Settings.load(env={"LEVERS9_HOME": "/h", "LEVERS9_NATS_AUTH": "off", "LEVERS9_RUNTIME": "RUNC",
                           "LEVERS9_CONTAINER_PEERS": "workspace", "LEVERS9_CACHE_PORT": "2051"},
                      profile=Path("/nonexistent"))
    assert s.bus.auth is False and s.worker.runtime is RuntimeKind.RUNC and s.images.cache_port == 2051
    assert s.network.container_peers is ContainerPeers.WORKSPACE and s.network.container_peers == "workspace"
    assert Settings().bus.auth is None and "LEVERS9_NATS_AUTH" not in Settings().as_env()
    assert s.as_env()["LEVERS9_NATS_AUTH"] == "off" and s.as_env()["LEVERS9_RUNTIME"] == "runc"


@pytest.mark.parametrize("variable, value, allowed", [
    ("LEVERS9_WORKER_CRIU", "maybe", "auto | on | off"),
    ("LEVERS9_RUNTIME", "docker", "auto | runc | process"),
    ("LEVERS9_CONTAINER_PEERS", "all", "none | deployment | workspace"),
    ("LEVERS9_WORKER_SHARED_CHECKPOINTS", "yes", "drop | keep | off"),
    ("LEVERS9_OTEL_EXPORTER", "otlp", "none | console"),
    ("LEVERS9_NATS_AUTH", "sometimes", "on | off"),
    ("LEVERS9_CACHE_PORT", "2050x", "whole number"),
])
def test_a_bad_value_names_the_variable_and_what_it_may_be(variable, value, allowed):
    with pytest.raises(SettingError) as caught:
        Settings.load(env={variable: value}, profile=Path("/nonexistent"))
    assert variable in str(caught.value) and repr(value) in str(caught.value) and allowed in str(caught.value)


def test_a_bad_profile_value_names_the_key_and_the_file(tmp_path):
    (tmp_path / "config.toml").write_text('log_format = "xml"\n')
    with pytest.raises(SettingError, match=r"log_format in .*config.toml = 'xml': use one of json \| text"):
        Settings.load(env={"LEVERS9_HOME": str(tmp_path)})


def test_unknown_variables_are_reported_and_declared_ones_are_not():
    env = {"LEVERS9_NATS_URLL": "nats://x", "LEVERS9_HOME": "/h", "LEVERS9_CONTAINER_ID": "c1",
           "LEVERS9_RUNNER_PORT": "8000", "LEVERS9_E2E_BACKEND": "compose", "LEVERS9_GATEWAY_URL": "http://g",
           "OTHER": "x"}
    s = Settings.load(env=env, profile=Path("/nonexistent"))
    assert s.unknown_env == ("LEVERS9_NATS_URLL",)
    assert "LEVERS9_NATS_URLL" in unknown_warning(s)
    assert unknown_warning(Settings.load(env={"LEVERS9_HOME": "/h"}, profile=Path("/nonexistent"))) == ""


def test_every_levers9_name_the_code_uses_is_known():
    """A variable read or set anywhere is a setting or declared in NOT_SETTINGS (else services warn of it)."""
    known = set(Settings.env_names()) | NOT_SETTINGS
    not_variables = {"LEVERS9_DLQ", "LEVERS9_CANARY"}  # a stream's name, a marker in test data
    files = [*ROOT.glob("sdk/**/*.py"), *ROOT.glob("libs/**/*.py"), *ROOT.glob("services/**/*.py"),
             *ROOT.glob("scripts/*.sh")]
    used = {m for f in files for m in re.findall(r"\bLEVERS9_[A-Z0-9_]*[A-Z0-9]\b", f.read_text())}
    unknown = sorted(n for n in used - known - not_variables if not n.startswith("LEVERS9_RUNNER_"))
    assert not unknown, f"neither settings nor in NOT_SETTINGS: {unknown}"


def test_environment_then_profile_then_default(tmp_path):
    (tmp_path / "config.toml").write_text('nats_url = "nats://profile"\ngateway_url = "http://profile"\n'
                                          'cache_port = 2099\nnats_auth = "on"\n')
    s = Settings.load(env={"LEVERS9_HOME": str(tmp_path), "LEVERS9_NATS_URL": "nats://env", "LEVERS9_GATEWAY_URL": ""})
    assert s.bus.nats_url == "nats://env" and s.client.gateway_url == "http://profile"
    assert s.images.cache_port == 2099 and s.bus.auth is True and s.storage.s3_region == "us-east-1"
    assert s.home == str(tmp_path) and s.given == {"home", "nats_url", "gateway_url", "cache_port", "nats_auth"}


def test_a_service_never_takes_a_credential_from_the_profile(tmp_path):
    (tmp_path / "config.toml").write_text("".join(f'{name} = "from-profile"\n' for name in PROFILE_CREDENTIALS))
    client = Settings.load(env={"LEVERS9_HOME": str(tmp_path)})
    service = Settings.load(env={"LEVERS9_HOME": str(tmp_path), "LEVERS9_SERVICE": "gateway"})
    assert all(client.get(name) == "from-profile" for name in PROFILE_CREDENTIALS)
    assert all(service.get(name) == "" for name in PROFILE_CREDENTIALS)
    given = Settings.load(env={"LEVERS9_HOME": str(tmp_path), "LEVERS9_SERVICE": "gateway", "LEVERS9_TOKEN": "t"})
    assert given.client.token == "t"


def test_with_takes_flat_names_and_parses_them():
    s = Settings().with_(service="worker", worker_criu="off", nats_auth="on", http_port="8080")
    assert (s.process.service, s.worker.criu, s.bus.auth, s.process.http_port) == ("worker", Criu.OFF, True, 8080)
    with pytest.raises(TypeError, match="not settings: nats"):
        Settings().with_(nats="x")
    with pytest.raises(SettingError, match="worker_criu = 'later'"):
        Settings().with_(worker_criu="later")


def test_the_gateways_websocket_limits_are_typed_settings_of_its_group():
    s = Settings.load(env={"LEVERS9_WEBSOCKET_IDLE_TIMEOUT_S": "30", "LEVERS9_WEBSOCKET_MAX_MESSAGE_BYTES": "65536"},
                      profile=Path("/nonexistent"))
    assert (s.gateway.websocket_idle_timeout_s, s.gateway.websocket_max_message_bytes) == (30, 65536)
    assert (Settings().gateway.websocket_idle_timeout_s, Settings().gateway.websocket_max_message_bytes) == \
        (300, 1024 * 1024)
    with pytest.raises(SettingError, match="LEVERS9_WEBSOCKET_MAX_MESSAGE_BYTES = '1MiB': use a whole number"):
        Settings.load(env={"LEVERS9_WEBSOCKET_MAX_MESSAGE_BYTES": "1MiB"}, profile=Path("/nonexistent"))
