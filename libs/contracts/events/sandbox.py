"""Events of sandboxes (aggregate `sandbox`): created, snapshotted, terminated.

Subjects are `levers9.<workspace>.sandbox.<sandbox_id>.<EventType>`. A sandbox is one container (its
id is the container's) of a sandbox deployment (`sb-<hash>`, code.kind "function" with
spec.sandbox); its container events (requested, ready, stopped) tell the rest of its story. Never
what runs in it: no command line, no file path, no output.
"""

from __future__ import annotations

from .base import Event


class SandboxCreated(Event, frozen=True, kw_only=True):
    AGGREGATE = "sandbox"
    ID_FIELD = "sandbox_id"
    sandbox_id: str
    deployment_id: str
    app: str = ""
    from_snapshot: str = ""  # the checkpoint it restores, "" for a fresh one
    token_id: str = ""  # the caller's token


class SandboxSnapshotted(Event, frozen=True, kw_only=True):
    """A snapshot (a checkpoint of its memory and file system) was asked for and stored."""
    AGGREGATE = "sandbox"
    ID_FIELD = "sandbox_id"
    sandbox_id: str
    checkpoint_id: str


class SandboxTerminated(Event, frozen=True, kw_only=True):
    """Asked for by its owner (`terminate`), or its lifetime (`timeout`) ran out."""
    AGGREGATE = "sandbox"
    ID_FIELD = "sandbox_id"
    sandbox_id: str
    reason: str
