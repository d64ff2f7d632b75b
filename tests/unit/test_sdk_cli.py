"""The CLI's app commands against a fake gateway: what they read out of a deployment's spec."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from levers9 import cli_app
from levers9.cli import app
from levers9.client import Client

SPEC = {"name": "hello", "app_name": "hello", "code": {"kind": "endpoint", "module": "hello", "handler": "hello"},
        "resources": {"cpu_millicores": 500, "memory_mib": 256, "gpu": ["H100", "A100"], "gpu_count": 2}}
ROW = {"deployment_id": "d1", "name": "hello", "version": 3, "status": "active",
       "created_at": "2026-01-01T00:00:00Z", "spec": SPEC}


@pytest.fixture
def invoke(monkeypatch):
    def handler(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("GET", "/api/v1/deployments")
        return httpx.Response(200, json=[ROW])

    monkeypatch.setattr(cli_app, "client",
                        lambda: Client("http://gateway.test", "tok", transport=httpx.MockTransport(handler)))
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def test_deployments_list_shows_what_the_spec_asks_for(invoke):
    result = invoke("deployments", "list")
    assert result.exit_code == 0, result.output
    header, row = [line for line in result.stdout.splitlines() if "hello" in line or "cpu_millicores" in line]
    cells = [c.strip() for c in row.strip("│┃ ").split("│")]
    names = [c.strip() for c in header.strip("│┃ ").split("┃")]
    shown = dict(zip(names, cells, strict=True))
    assert shown["cpu_millicores"] == "500" and shown["memory_mib"] == "256"
    assert shown["gpu"] == "H100,A100" and shown["gpu_count"] == "2" and shown["version"] == "3"


def test_deployments_list_json_is_the_gateways_answer(invoke):
    result = invoke("deployments", "list", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [ROW]


def test_deployment_columns_without_a_spec():
    assert cli_app.deployment_columns({"name": "x", "version": 1}) == {"name": "x", "version": 1}
    assert cli_app.deployment_columns({"name": "x", "spec": {"resources": {"gpu": []}}}) == {"name": "x"}


def test_the_status_table_prints_no_password():
    from levers9.cli import without_password

    assert without_password("postgresql://postgres:s3cr3t@127.0.0.1:5432/levers9?sslmode=disable") == \
        "postgresql://postgres:***@127.0.0.1:5432/levers9?sslmode=disable"
    assert without_password("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"
    assert without_password("postgresql://u:p%40ss@[::1]:5432/db") == "postgresql://u:***@[::1]:5432/db"
