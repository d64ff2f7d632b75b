"""levers9: the client SDK and the CLI.

`from levers9 import App, Image, Secret` must work inside a container, where this folder is mounted
alone on a bare python3: this module, levers9.app, levers9.options, levers9.functions and
levers9.function_errors, levers9.task_queues import the standard library only (a call's grpc and cloudpickle are imported
when the first call is made).
"""

__version__ = "0.1.0"

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

__all__ = ["App", "ConfigError", "Image", "Secret", "load_app_file", "__version__", "Volume", "CloudBucket",
           "Function", "FunctionCall", "Session", "Sandbox", "SandboxError", "TaskQueue", "TaskHandle", "TaskError", "TaskApiError", "Scheduled",
           "FunctionError", "RemoteError", "RemoteTraceback", "PlatformError", "FunctionTimeoutError",
           "FunctionCancelledError", "ArgumentError", "ResultError", "PythonVersionError", "GatewayError",
           "AuthenticationError", "FunctionNotFoundError", "InvalidCallError", "GatewayUnavailableError"]
