"""Events of Python function calls (aggregate `call`): one attempt began, one attempt ended.

Subjects are `levers9.<workspace>.call.<call_id>.<EventType>`. Never the arguments or the result.
"""

from __future__ import annotations

from .base import Event


class FunctionCallStarted(Event, frozen=True, kw_only=True):
    """One attempt of a Python function call began in a sandbox. Never its arguments."""
    AGGREGATE = "call"
    ID_FIELD = "call_id"
    call_id: str
    deployment_id: str
    function: str  # app.name
    token_id: str = ""  # the caller's token
    attempt: int = 1
    container_id: str = ""
    mode: str = "call"  # call | spawn | rest
    session_id: str = ""


class FunctionCallFinished(Event, frozen=True, kw_only=True):
    """How one attempt ended. Never its result: `outcome` is ok | error | timeout | cancelled |
    failed (a platform failure: the sandbox died, no capacity), with the exception's type or the reason."""
    AGGREGATE = "call"
    ID_FIELD = "call_id"
    call_id: str
    deployment_id: str
    function: str
    attempt: int = 1
    outcome: str
    duration_ms: float = 0.0
    error_type: str = ""
    reason: str = ""
    retrying: bool = False
