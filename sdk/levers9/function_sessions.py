"""`with app.session():` the calls of an app's functions in the block share one sandbox.

A session is a contextvar of the open sessions; a call (levers9.function_calls) sends the innermost
one of its app with its Hello. Standard library only, like levers9.functions: a user's file is
imported inside containers too; ending a session needs grpc, imported when a used one ends.
"""

from __future__ import annotations

import contextvars
import uuid
import warnings
from typing import Any

_sessions: contextvars.ContextVar[tuple["Session", ...]] = contextvars.ContextVar("levers9_sessions", default=())


class Session:
    """`with app.session():` the calls of the app's functions in the block carry one session id, so
    they share one sandbox; at the end the client ends the session (its sandbox stops)."""

    def __init__(self, app_name: str):
        self.app_name = app_name
        self.id = ""
        self.used = False
        self._token: contextvars.Token[tuple[Session, ...]] | None = None

    def use(self) -> str:
        self.used = True
        return self.id

    def __enter__(self) -> "Session":
        if self._token is not None:
            raise RuntimeError("this session is already open: call app.session() for another")
        self.id = str(uuid.uuid4())
        self._token = _sessions.set((*_sessions.get(), self))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        assert self._token is not None
        _sessions.reset(self._token)
        self._token = None
        if not self.used:
            return  # no call was made: the gateway knows nothing of it
        from levers9 import function_client
        from levers9.function_errors import FunctionError

        try:
            function_client.end_session(self.id)
        except FunctionError as error:
            if exc_type is None:
                raise
            warnings.warn(f"ending session {self.id} failed: {error}", stacklevel=2)


def session_for(app_name: str) -> Session | None:
    """The innermost open session of that app in this context."""
    for session in reversed(_sessions.get()):
        if session.app_name == app_name:
            return session
    return None
