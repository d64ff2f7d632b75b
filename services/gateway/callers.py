"""Who is calling: the workspace, token and scope a bearer token stands for.

Its own module because both sides need it: the gateway's state caches callers by token hash
(state.py), and the request dependencies that find them (auth.py) read that state.
"""

from __future__ import annotations

from pydantic import BaseModel


class Caller(BaseModel):
    workspace: str
    token_id: str
    scope: str = "workspace"
