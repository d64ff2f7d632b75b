"""The gateway's OpenAPI documents the error codes its routes answer (schemathesis checks the live
spec in tests/e2e/test_fuzz.py), and a server it needs being down is a 503 that names it."""

from __future__ import annotations

from botocore.exceptions import EndpointConnectionError
from fastapi import FastAPI
from fastapi.testclient import TestClient

from levers9.gateway.errors import install
from levers9.gateway.openapi_docs import document, responses_for
from levers9.runtime.config import Settings
from levers9.services import service_class


def gateway_spec() -> dict:
    return service_class("gateway")(Settings.load(env={})).app().openapi()


def test_every_authenticated_operation_documents_401_403_and_503():
    spec = gateway_spec()
    ops = [(path, method, op) for path, item in spec["paths"].items() for method, op in item.items()]
    assert len(ops) > 30
    for path, method, op in ops:
        if path in ("/healthz", "/metrics"):
            continue
        assert {"401", "403", "503"} <= set(op["responses"]), (method, path, sorted(op["responses"]))
        assert all("description" in r for r in op["responses"].values())


def test_endpoint_calls_answer_what_the_handler_answers_and_operation_ids_are_unique():
    spec = gateway_spec()
    assert "default" in spec["paths"]["/endpoint/{name}"]["post"]["responses"]
    assert {"404", "413", "502", "504"} <= set(spec["paths"]["/endpoint/{name}/{rest}"]["get"]["responses"])
    ids = [op["operationId"] for item in spec["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))


def test_a_declared_code_is_kept_and_public_routes_get_none():
    assert responses_for("levers9.gateway.routes_containers", "/healthz") == {}
    assert "502" in responses_for("levers9.gateway.routes_containers", "/api/v1/containers")
    app = FastAPI()

    @app.post("/x", status_code=201)
    def x() -> dict:
        return {}

    x.__module__ = "levers9.gateway.routes_tokens"
    app.router.routes[-1].endpoint.__module__ = "levers9.gateway.routes_tokens"
    document(app)
    assert {"201", "401", "404", "422"} <= set(app.openapi()["paths"]["/x"]["post"]["responses"])


def test_an_unreachable_object_store_is_a_503_that_names_it():
    app = FastAPI()
    install(app)

    @app.get("/boom")
    async def boom() -> None:
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1/bucket")

    r = TestClient(app).get("/boom")
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert "object store (S3) is unreachable" in r.json()["detail"] and "127.0.0.1:1" in r.json()["detail"]


def test_a_405_lists_every_method_served_at_the_path():
    app = FastAPI()
    install(app)

    @app.get("/things")
    def list_things() -> list:
        return []

    @app.post("/things")
    def add_thing() -> dict:
        return {}

    @app.get("/things/special")
    def special() -> dict:
        return {}

    @app.delete("/things/{name}")
    def delete_thing(name: str) -> dict:
        return {}

    client = TestClient(app)
    r = client.request("PATCH", "/things")
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
    assert client.request("PUT", "/things/special").headers["allow"] == "GET"  # the exact path wins
    assert client.request("PUT", "/things/other").headers["allow"] == "DELETE"


def test_non_json_bodies_and_handler_checks_are_in_the_spec():
    spec = gateway_spec()
    assert "text/plain" in spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert "application/x-ndjson" in spec["paths"]["/api/v1/images/{image}/events"]["get"]["responses"]["200"]["content"]
    assert spec["components"]["schemas"]["VolumeRequest"]["properties"]["name"]["pattern"]


def test_a_422_may_carry_a_validation_list_or_a_sentence():
    op = gateway_spec()["paths"]["/api/v1/deployments"]["post"]
    schema = op["responses"]["422"]["content"]["application/json"]["schema"]
    assert len(schema["anyOf"]) == 2 and schema["anyOf"][1]["required"] == ["detail"]


def test_every_status_a_route_module_raises_is_documented_for_it():
    """A route module that raises HTTPException(N) lists N in openapi_docs.BY_MODULE (schemathesis
    found the clusters routes answering 400 and 404 undocumented)."""
    import re
    from pathlib import Path

    from levers9.gateway import openapi_docs

    folder = Path(openapi_docs.__file__).parent
    for path in sorted(folder.glob("routes_*.py")):
        raised = {int(c) for c in re.findall(r"HTTPException\(\s*(\d{3})", path.read_text())}
        documented = set(openapi_docs.BY_MODULE.get(path.stem, ())) | set(openapi_docs.AUTHENTICATED) | {422, 503}
        assert raised <= documented, f"{path.name} raises {sorted(raised - documented)} undocumented"
