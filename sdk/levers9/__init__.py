"""levers9: the client SDK and the CLI.

`from levers9 import App, Image, Secret` must work inside a container, where this folder is mounted
alone on a bare python3: this module, levers9.app, levers9.options, levers9.functions and
levers9.function_errors, levers9.task_queues import the standard library only (a call's grpc and cloudpickle are imported
when the first call is made).

The names below are imported when first used (PEP 562), not when `levers9` is: a container's
runner (`python3 -m levers9.runner`) imports this package before anything else, and a sandbox or an
ad-hoc function's runner needs none of the SDK's user-facing modules (levers9.app alone took ~150 ms
of each such cold start on a busy machine).
"""

__version__ = "0.1.0"

import importlib
from typing import TYPE_CHECKING, Any

_ERRORS = ("ArgumentError", "AuthenticationError", "FunctionCancelledError", "FunctionError", "FunctionNotFoundError",
           "FunctionTimeoutError", "GatewayError", "GatewayUnavailableError", "InvalidCallError", "PlatformError",
           "PythonVersionError", "RemoteError", "RemoteTraceback", "ResultError")
_WHERE = {**dict.fromkeys(("App", "ConfigError", "Image", "Secret", "load_app_file"), "levers9.app"),
          **dict.fromkeys(_ERRORS, "levers9.function_errors"),
          **dict.fromkeys(("Function", "FunctionCall", "Session"), "levers9.functions"),
          **dict.fromkeys(("Sandbox", "SandboxError"), "levers9.sandbox"),
          **dict.fromkeys(("Scheduled", "TaskApiError", "TaskError", "TaskHandle", "TaskQueue"), "levers9.task_queues"),
          **dict.fromkeys(("CloudBucket", "Volume"), "levers9.volumes")}

__all__ = ["App", "ConfigError", "Image", "Secret", "load_app_file", "__version__", "Volume", "CloudBucket",
           "Function", "FunctionCall", "Session", "Sandbox", "SandboxError", "TaskQueue", "TaskHandle", "TaskError",
           "TaskApiError", "Scheduled", "FunctionError", "RemoteError", "RemoteTraceback", "PlatformError",
           "FunctionTimeoutError", "FunctionCancelledError", "ArgumentError", "ResultError", "PythonVersionError",
           "GatewayError", "AuthenticationError", "FunctionNotFoundError", "InvalidCallError", "GatewayUnavailableError"]
assert set(__all__) == {"__version__", *_WHERE}, "a name exported is not lazily importable, or the reverse"


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'levers9' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain one
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


if TYPE_CHECKING:
    from levers9.app import App, ConfigError, Image, Secret, load_app_file
    from levers9.function_errors import (
        ArgumentError,
        AuthenticationError,
        FunctionCancelledError,
        FunctionError,
        FunctionNotFoundError,
        FunctionTimeoutError,
        GatewayError,
        GatewayUnavailableError,
        InvalidCallError,
        PlatformError,
        PythonVersionError,
        RemoteError,
        RemoteTraceback,
        ResultError,
    )
    from levers9.functions import Function, FunctionCall, Session
    from levers9.sandbox import Sandbox, SandboxError
    from levers9.task_queues import Scheduled, TaskApiError, TaskError, TaskHandle, TaskQueue
    from levers9.volumes import CloudBucket, Volume
