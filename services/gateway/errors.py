"""A server the gateway needs is down: answer 503 with a sentence that names it and says to retry,
never a bare 500. (Found by the fault tests: with S3 down for 30 s a deploy answered
"Internal Server Error" after botocore's retries.)"""

from __future__ import annotations

import logging

import asyncpg
import nats.errors
from botocore.exceptions import ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

log = logging.getLogger("levers9.gateway")

S3_DOWN = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)
POSTGRES_DOWN = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, asyncpg.exceptions.CannotConnectNowError,
                 ConnectionRefusedError)
NATS_DOWN = (nats.errors.ConnectionClosedError, nats.errors.NoRespondersError, nats.errors.TimeoutError)


def unavailable(what: str, exc: BaseException) -> JSONResponse:
    log.warning("%s unreachable: %r", what, exc)
    return JSONResponse({"detail": f"{what} is unreachable ({type(exc).__name__}: {exc}); retry once it is "
                                   f"back (`levers9 status` shows it)"},
                        status_code=503, headers={"Retry-After": "5"})


def install(app: FastAPI) -> None:
    async def s3_down(request: Request, exc: Exception) -> JSONResponse:
        return unavailable("the object store (S3)", exc)

    async def postgres_down(request: Request, exc: Exception) -> JSONResponse:
        return unavailable("the database (Postgres)", exc)

    async def nats_down(request: Request, exc: Exception) -> JSONResponse:
        return unavailable("the event log (NATS)", exc)

    for kinds, handler in ((S3_DOWN, s3_down), (POSTGRES_DOWN, postgres_down), (NATS_DOWN, nats_down)):
        for kind in kinds:
            app.add_exception_handler(kind, handler)
