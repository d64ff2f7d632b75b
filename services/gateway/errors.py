"""A server the gateway needs is down: answer 503 with a sentence that names it and says to retry,
never a bare 500. (Found by the fault tests: with S3 down for 30 s a deploy answered
"Internal Server Error" after botocore's retries.)"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import nats.errors
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from levers9.runtime.storage import S3_UNREACHABLE, S3Unavailable

from .host_paths import hostless, hostless_detail

log = logging.getLogger("levers9.gateway")

S3_DOWN = (*S3_UNREACHABLE, S3Unavailable)
POSTGRES_DOWN = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, asyncpg.exceptions.CannotConnectNowError,
                 ConnectionRefusedError)
NATS_DOWN = (nats.errors.ConnectionClosedError, nats.errors.NoRespondersError, nats.errors.TimeoutError)


def unavailable(what: str, exc: BaseException) -> JSONResponse:
    log.warning("%s unreachable: %r", what, exc)
    why = hostless(str(exc))[:300]
    return JSONResponse({"detail": f"{what} is unreachable ({type(exc).__name__}: {why}); retry once it is "
                                   f"back (`levers9 status` shows it)"},
                        status_code=503, headers={"Retry-After": "5"})


def validation_errors(errors: Any) -> list[dict[str, Any]]:
    """FastAPI's validation errors without the input they refused (its default 422 quotes it whole: a
    60 MB token name came back in a 62 MB answer) and with short messages."""
    return [{"type": e.get("type", ""), "loc": list(e.get("loc", ()))[:10], "msg": str(e.get("msg", ""))[:300]}
            for e in list(errors)[:20]]


def allowed_methods(app: FastAPI, scope: dict) -> list[str]:
    """Every method some route serves at this path. Starlette's 405 lists only the first route whose
    path matched (GET /api/v1/containers answered `Allow: GET`, though POST is served there too). A
    route without parameters takes precedence over templated ones, as in OpenAPI."""
    from .openapi_docs import api_routes

    matched = [route for _, route in api_routes(app.routes)
               if route.matches({**scope, "method": next(iter(route.methods or {"GET"}))})[0] == Match.FULL]
    exact = [r for r in matched if not r.param_convertors]
    return sorted({m for r in (exact or matched) for m in (r.methods or ())})


def install(app: FastAPI) -> None:
    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        exc.detail = hostless_detail(exc.detail)  # a library's message may name a file of the host
        if exc.status_code == 405:
            methods = allowed_methods(app, dict(request.scope))
            if methods:
                exc.headers = {**(exc.headers or {}), "Allow": ", ".join(methods)}
        return await http_exception_handler(request, exc)

    app.add_exception_handler(StarletteHTTPException, method_not_allowed)

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return JSONResponse({"detail": validation_errors(exc.errors())}, status_code=422)

    app.add_exception_handler(RequestValidationError, invalid)

    async def s3_down(request: Request, exc: Exception) -> JSONResponse:
        return unavailable("the object store (S3)", exc)

    async def postgres_down(request: Request, exc: Exception) -> JSONResponse:
        return unavailable("the database (Postgres)", exc)

    async def nats_down(request: Request, exc: Exception) -> JSONResponse:
        return unavailable("the event log (NATS)", exc)

    for kinds, handler in ((S3_DOWN, s3_down), (POSTGRES_DOWN, postgres_down), (NATS_DOWN, nats_down)):
        for kind in kinds:
            app.add_exception_handler(kind, handler)
