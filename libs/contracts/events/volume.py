"""Events of volumes: a workspace's named directories on the platform's JuiceFS file system.

Their subjects are `levers9.<workspace>.volume.<name>.<EventType>`: a name is unique per workspace.
The files themselves are not events: they live in JuiceFS (metadata in Postgres, data in S3).
"""

from __future__ import annotations

from .base import Event


class VolumeCreated(Event, frozen=True, kw_only=True):
    AGGREGATE = "volume"
    ID_FIELD = "name"
    name: str  # levers9.contracts.volumes.VolumeName (a subject token: checked by the subject)


class VolumeDeleted(Event, frozen=True, kw_only=True):
    """The volume and every file in it are gone (the gateway removed its directory first)."""
    AGGREGATE = "volume"
    ID_FIELD = "name"
    name: str  # levers9.contracts.volumes.VolumeName (a subject token: checked by the subject)
