"""The runner's configuration: read once from LEVERS9_RUNNER_* environment variables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from levers9.executor import wire

EXIT_FAILED = 3  # import or on_start failed: the worker reports the container as failed
EXIT_USAGE = 2  # the runner's own environment is wrong
FAILED_EXIT_DELAY = 1.0  # seconds the failed health answer stays up before the exit
STOP_GRACE_SECONDS = 10.0
KINDS = ("endpoint", "asgi", "realtime", "function")
EXECUTOR_SOCKET = f"{wire.SOCKET_DIR}/{wire.SOCKET_NAME}"
PACKAGES_DIR = "/var/lib/levers9/packages"  # the worker binds the node's per-workspace install cache here


@dataclass(frozen=True)
class Config:
    module: str
    handler: str
    kind: str = "endpoint"  # endpoint | asgi | realtime (a handler per WebSocket message) | function (a sandbox whose executor runs Python calls)
    on_start: str = ""
    app_dir: str = "/app"
    host: str = "0.0.0.0"
    port: int = 8000
    concurrency: int = 1
    timeout: float = 0.0  # seconds a request may run; 0: no limit
    max_body: int = 16 * 1024 * 1024
    # kind function only: the executor's socket, where packages= installs go, and modules imported at
    # load (so that a checkpoint taken once ready holds them imported)
    executor_socket: str = EXECUTOR_SOCKET
    packages_dir: str = PACKAGES_DIR
    imports: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: dict[str, str]) -> "Config":
        def get(name: str, default: str = "") -> str:
            return env.get(f"LEVERS9_RUNNER_{name}", "").strip() or default

        def number(name: str, default: str, kind: Callable[[str], Any], minimum: float) -> Any:
            raw = get(name, default)
            try:
                value = kind(raw)
            except ValueError:
                value = None
            if value is None or value < minimum:
                raise ValueError(f"LEVERS9_RUNNER_{name}={raw!r} is not valid: use a number of at least {minimum}")
            return value

        module, handler, kind = get("MODULE"), get("HANDLER"), get("KIND", "endpoint")
        if kind not in KINDS:
            raise ValueError(f"LEVERS9_RUNNER_KIND={kind!r} is not valid: use endpoint or asgi for an HTTP app, realtime for "
                             "a WebSocket message handler, "
                             "or function for a sandbox of Python function calls")
        # a function sandbox may be ad hoc: every call brings its function pickled
        if kind != "function" and (not module or not handler):
            raise ValueError("LEVERS9_RUNNER_MODULE and LEVERS9_RUNNER_HANDLER must name the user's module "
                             "and function")
        if handler and not module:
            raise ValueError("LEVERS9_RUNNER_HANDLER is set without LEVERS9_RUNNER_MODULE: name its module")
        imports = tuple(name.strip() for name in get("IMPORTS").split(",") if name.strip())
        return cls(module=module, handler=handler, kind=kind, on_start=get("ON_START"),
                   app_dir=get("APP_DIR", "/app"), host=get("HOST", "0.0.0.0"),
                   port=number("PORT", "8000", int, 0), concurrency=number("CONCURRENCY", "1", int, 1),
                   timeout=number("TIMEOUT", "0", float, 0), max_body=number("MAX_BODY", str(16 << 20), int, 0),
                   executor_socket=env.get("LEVERS9_EXECUTOR_SOCKET", "").strip() or EXECUTOR_SOCKET,
                   packages_dir=env.get("LEVERS9_EXECUTOR_PACKAGES_DIR", "").strip() or PACKAGES_DIR,
                   imports=imports)
