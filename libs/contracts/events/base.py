"""The base of every event: a small, frozen msgspec Struct tagged with its class name.

Events are facts in the past tense. Each class names its aggregate and the field that holds the
aggregate's id; the subject is computed from those (subjects.py). `VERSION` is the schema version of
the body; bump it only with an upcaster in upcasting.py. Adding a field with a default needs no bump.

The event classes live one module per aggregate beside this one; the package (`__init__.py`) joins
them into one tagged union, `AnyEvent`, and the registry of type names, `EVENT_TYPES`.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec


class Event(msgspec.Struct, frozen=True, kw_only=True, tag=True, tag_field="type"):
    AGGREGATE: ClassVar[str] = ""
    ID_FIELD: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    SYSTEM: ClassVar[bool] = False  # platform aggregate: lives in workspace `_sys`

    @property
    def aggregate_id(self) -> str:
        return getattr(self, self.ID_FIELD)

    @classmethod
    def type_name(cls) -> str:
        return cls.__name__
