"""One HTTP exchange as endpoint.py and asgi.py see it: the request line, headers and socket, the
runtime, and the two ways to answer (`start` a response, or `send_json` a whole one).

server.Handler is the one implementation. It routes each request to endpoint.py or asgi.py, so they
know it only through this protocol and never import server.py back.
"""

from __future__ import annotations

import email.message
from io import BufferedIOBase
from typing import Any, Protocol

from levers9.runner.runtime import Runtime


class RunnerServer(Protocol):
    @property
    def runtime(self) -> Runtime: ...

    @property
    def server_port(self) -> int: ...


class Exchange(Protocol):
    close_connection: bool  # set when the connection must not be reused

    @property
    def command(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def request_version(self) -> str: ...

    @property
    def headers(self) -> email.message.Message: ...

    @property
    def client_address(self) -> Any: ...

    @property
    def wfile(self) -> BufferedIOBase: ...

    @property
    def rfile(self) -> BufferedIOBase: ...

    @property
    def connection(self) -> Any: ...  # the socket (a WebSocket shuts it down to end its reader)

    @property
    def server(self) -> RunnerServer: ...

    def start(self, status: int, headers: list[tuple[str, str]]) -> None: ...

    def send_json(self, status: int, doc: Any, close: bool = False, encoded: bytes | None = None,
                  extra: list[tuple[str, str]] | None = None) -> None: ...
