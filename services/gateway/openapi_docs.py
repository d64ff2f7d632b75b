"""The status codes the gateway's OpenAPI documents, beside the ones FastAPI infers (the declared
success code and 422): every error a route can answer, with the `detail` body it carries.

Kept in one table so a route module needs no decorator noise; the table is per route module (what
its handlers raise, read from them) plus what every authenticated route can answer (401 without a
valid token, 403 for a token that may not use that route). tests/e2e/test_fuzz.py runs schemathesis
with all its checks against the spec, so a code answered but not documented here fails there.
Calls to an endpoint (/endpoint/...) answer whatever the user's handler answers: `default`."""

from __future__ import annotations

import warnings
from typing import Any, Iterable, Iterator

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

WHY = {
    400: "The request is not valid (the detail says what to change).",
    401: "Missing, unknown or revoked bearer token.",
    403: "Refused: this token may not use this route (a worker token on the user API, platform objects "
         "with a token of another workspace), or the request asks for what is refused (the detail says what).",
    404: "No such object in the caller's workspace.",
    409: "The object's state does not allow this now (the detail says why).",
    410: "It has ended: that version of the endpoint was stopped or deleted, or the sandbox was terminated.",
    413: "The body (or a code archive, unpacked) is over the gateway's limit: the detail names it.",
    422: "The body or a parameter does not validate.",
    429: "The deployment's wait queue is full (its max_pending calls already wait): retry after Retry-After seconds.",
    500: "The function raised: its exception type, message and traceback are in the body.",
    502: "A container failed to start or answer: the detail says why.",
    503: "A dependency is not reachable or not ready yet (no capacity, object storage down...): retry later.",
    504: "The call ran past its timeout.",
}

AUTHENTICATED = (401, 403)
BODY_CHECKED = (400, 413)  # any route with a body: body_limits.py refuses a bad or oversized one first
UNAVAILABLE = 503  # any route: a server it needs (Postgres, NATS, S3) is unreachable (see service.py)

# what each route module's handlers raise, besides 401/403/422/503 (every authenticated route)
BY_MODULE: dict[str, tuple[int, ...]] = {
    "routes_tokens": (400, 404),
    "routes_catalogues": (400, 404, 409, 413),
    "routes_deployments": (400, 404, 409, 413),
    "routes_images": (400, 404, 409),
    "routes_containers": (404, 502),
    "routes_checkpoints": (404, 409),
    "routes_workers": (404,),
    "routes_internal": (404, 409),
    "routes_functions": (400, 404, 409, 413, 500, 502, 504),
    "routes_invoke": (404, 410, 413, 429, 502, 504),
    "routes_boxes": (404, 413, 429, 502, 504),
    "routes_sandboxes": (400, 404, 409, 410, 413, 500, 502, 504),  # the agent's own answers pass through
    "routes_volumes": (400, 404, 409, 413),
    "routes_clusters": (400, 404, 409),
    "routes_events": (),
    "routes_calls": (404, 409),
    "routes_stats": (404,),
    "routes_tasks": (400, 404, 409, 413),
    "routes_scaling": (400, 404, 409, 413),
}
PUBLIC = {"/healthz", "/metrics"}
# routes whose success body is not JSON
CONTENT_TYPES = {"/metrics": "text/plain", "/api/v1/images/{image}/events": "application/x-ndjson",
                 "/api/v1/events/stream": "text/event-stream"}
# one Server-Sent Event as a client parses it (its `data` is the event's JSON, as a string): what a
# text/event-stream response's schema describes, each event checked against it
SSE_EVENT: dict[str, Any] = {"type": "object", "properties": {
    "id": {"type": "string", "description": "the event's stream sequence: send it back as Last-Event-ID"},
    "event": {"type": "string", "description": "the event type, e.g. ContainerReady"},
    "data": {"type": "string", "description": "the event as JSON (seq, id, type, occurred_at, data, ...)"},
    "retry": {"type": "integer"}}}
# what a handler checks beyond the type FastAPI infers: said in the spec too (component -> field -> keywords)
CONSTRAINTS: dict[str, dict[str, dict[str, Any]]] = {
    "VolumeRequest": {"name": {"pattern": r"^[a-z0-9][a-z0-9-]{0,62}$"}},  # levers9.contracts.volumes.VolumeName
    "Body_deploy_api_v1_deployments_post": {"spec": {"minLength": 1}},  # an empty form field is a missing one
}


def _error(code: int) -> dict[str, Any]:
    return {"description": WHY[code], "content": {"application/json": {"schema": {
        "type": "object", "properties": {"detail": {}}, "required": ["detail"]}}}}


def responses_for(module: str, path: str) -> dict[str, dict[str, Any]]:
    """The error responses of one route: what its module raises, plus what every authenticated route can."""
    if path in PUBLIC:
        return {}
    codes = set(BY_MODULE.get(module.rsplit(".", 1)[-1], ())) | set(AUTHENTICATED) | set(BODY_CHECKED) | {
        UNAVAILABLE, 422}
    out = {str(code): _error(code) for code in sorted(codes)}
    if module.endswith("routes_invoke"):
        out["default"] = {"description": "Whatever the endpoint's own handler answers."}
    if module.endswith("routes_boxes"):
        out["default"] = {"description": "Whatever the box's program answers."}
    return out


def document(app: FastAPI) -> None:
    """Make app.openapi() document every route's error responses (computed once, like FastAPI's)."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            with warnings.catch_warnings():  # a route of several methods: its ids are made unique below
                warnings.filterwarnings("ignore", "Duplicate Operation ID")
                schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path, route in api_routes(app.routes):
                extra = responses_for(route.endpoint.__module__, path)
                for method in route.methods or ():
                    op = schema["paths"].get(path, {}).get(method.lower())
                    if op is not None:
                        op["responses"] = {**extra, **op.get("responses", {})}
                        either_422(op["responses"])
            unique_operation_ids(schema)
            declare_content_and_constraints(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    setattr(app, "openapi", openapi)  # noqa: B010 - FastAPI's documented way to customise the schema


def api_routes(routes: Iterable[Any], prefix: str = "") -> Iterator[tuple[str, APIRoute]]:
    """(path as the spec writes it, route) of every API route, into included routers too (FastAPI
    keeps an included router as one lazy entry; its prefix is in its include context)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield prefix + route.path_format, route
        elif hasattr(route, "original_router"):
            context = getattr(route, "include_context", None)
            yield from api_routes(route.original_router.routes, prefix + (getattr(context, "prefix", "") or ""))


def unique_operation_ids(schema: dict[str, Any]) -> None:
    """FastAPI gives every method of one multi-method route the same operationId; OpenAPI wants them unique."""
    seen: set[str] = set()
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            if op.get("operationId") in seen:
                op["operationId"] = f"{op['operationId']}_{method}_{len(seen)}"
            seen.add(op.get("operationId", f"{method} {path}"))


def declare_content_and_constraints(schema: dict[str, Any]) -> None:
    for path, content_type in CONTENT_TYPES.items():
        ok = schema["paths"].get(path, {}).get("get", {}).get("responses", {}).get("200")
        if ok is not None:
            ok["content"] = {content_type: {"schema": SSE_EVENT if content_type == "text/event-stream"
                                            else {"type": "string"}}}
    components = schema.get("components", {}).get("schemas", {})
    for name, fields in CONSTRAINTS.items():
        for field, keywords in fields.items():
            prop = components.get(name, {}).get("properties", {}).get(field)
            if prop is not None:
                prop.update(keywords)


def either_422(responses: dict[str, Any]) -> None:
    """FastAPI documents 422 as its validation error list; a handler's own 422 carries a sentence."""
    content = responses.get("422", {}).get("content", {}).get("application/json")
    if content is not None and content.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
        content["schema"] = {"anyOf": [content["schema"], _error(422)["content"]["application/json"]["schema"]]}
