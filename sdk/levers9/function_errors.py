"""The errors of Python function calls, precise enough to catch the one you mean.

    FunctionError                      every failure of a call that is not the function's own exception
    ├── RemoteError                    the function raised an exception whose type cannot exist here
    ├── PlatformError                  the platform failed the call (Result.reason): sandbox died, ...
    │   ├── FunctionTimeoutError       (also a TimeoutError) the call ran past its timeout
    │   └── FunctionCancelledError     the call was cancelled
    ├── ArgumentError                  (also a TypeError) an argument cannot be pickled; nothing was sent
    ├── ResultError                    a returned value cannot be unpickled here
    ├── PythonVersionError             this Python's major.minor is not the sandbox's
    └── GatewayError                   the gateway refused the call (a gRPC status)
        ├── AuthenticationError        UNAUTHENTICATED, PERMISSION_DENIED
        ├── FunctionNotFoundError      NOT_FOUND, or no such deployed function
        ├── InvalidCallError           INVALID_ARGUMENT, FAILED_PRECONDITION
        └── GatewayUnavailableError    UNAVAILABLE: the gateway cannot be reached

An exception the function raised is raised as its own type when it unpickles here. Either way the
remote traceback is attached: `exc.remote_traceback` (text) and `exc.__cause__`, a RemoteTraceback,
so a printed traceback shows the remote frames, then "The above exception was the direct cause...".

Standard library only: `from levers9 import RemoteError` works where grpc is not installed.
"""

from __future__ import annotations


class FunctionError(Exception):
    """A function call failed for a reason other than the function's own exception."""

    correlation_id: str = ""


class RemoteTraceback(Exception):
    """The remote traceback as an exception, set as the raised exception's __cause__ (as
    concurrent.futures does for a process pool's exceptions): printing shows the remote frames."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'


class RemoteError(FunctionError):
    """The function raised an exception that cannot be rebuilt here (its type's module is not
    installed locally, or it did not pickle); its type name, message and traceback as text."""

    def __init__(self, error_type: str, error: str, traceback: str = "", correlation_id: str = ""):
        super().__init__(f"{error_type}: {error}" if error else error_type)
        self.error_type = error_type
        self.error = error
        self.remote_traceback = traceback
        self.correlation_id = correlation_id

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str]]:
        return type(self), (self.error_type, self.error, self.remote_traceback, self.correlation_id)


class PlatformError(FunctionError):
    """The platform failed the call (the sandbox died, the call timed out or was cancelled)."""

    def __init__(self, message: str, reason: str = "", call_id: str = "", correlation_id: str = ""):
        super().__init__(message)
        self.reason = reason
        self.call_id = call_id
        self.correlation_id = correlation_id

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str]]:
        return type(self), (str(self), self.reason, self.call_id, self.correlation_id)


class FunctionTimeoutError(PlatformError, TimeoutError):
    """The call ran past its timeout (or FunctionCall.get(timeout=) waited that long)."""


class FunctionCancelledError(PlatformError):
    """The call was cancelled (Ctrl-C, a failing .map, or the platform)."""


class ArgumentError(FunctionError, TypeError):
    """An argument cannot be pickled; nothing was sent."""


class ResultError(FunctionError):
    """The returned value (or a generator's item) cannot be unpickled here."""


class PythonVersionError(FunctionError):
    """This Python's major.minor differs from the sandbox's: pickles would not load there."""


class GatewayError(FunctionError):
    """The gateway refused the call; `code` is the gRPC status name, `details` what the gateway said."""

    def __init__(self, message: str, code: str = "", details: str = ""):
        super().__init__(message)
        self.code = code
        self.details = details

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return type(self), (str(self), self.code, self.details)


class AuthenticationError(GatewayError):
    """The token is missing, wrong or not allowed to call this function."""


class FunctionNotFoundError(GatewayError):
    """No such function: deploy it first, or check the app and function names."""


class InvalidCallError(GatewayError):
    """The gateway found the call malformed (a bad spec, a bad option)."""


class GatewayUnavailableError(GatewayError):
    """The gateway's function service cannot be reached."""


def platform_error(reason: str, call_id: str = "", correlation_id: str = "", what: str = "the call") -> PlatformError:
    """The PlatformError subclass for a Result's reason, with a message saying where to look."""
    lowered = reason.lower()
    cls: type[PlatformError] = (FunctionTimeoutError if "timeout" in lowered or "timed out" in lowered else
                                FunctionCancelledError if "cancel" in lowered else PlatformError)
    where = f" (call {call_id})" if call_id else ""
    story = (f": `levers9 events replay --correlation-id {correlation_id}` tells its story"
             if correlation_id else "")
    return cls(f"{what}{where} failed on the platform: {reason}{story}", reason, call_id, correlation_id)
