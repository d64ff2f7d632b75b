"""The envelope every message carries, and the one way to read and write it.

Decoding is two-step (FACTS: an unknown tag in a union raises): the envelope first with `data` kept
raw, then the body by its `type`, upcast to the current version. Unknown fields are ignored both in
the envelope and in bodies, so newer publishers do not break older readers.
"""

from __future__ import annotations

import datetime as _dt

import msgspec

from . import subjects
from .events import EVENT_TYPES, Event
from .ids import SYSTEM_WORKSPACE, UUID_RE, InvalidName, check_workspace, uuid7
from .upcasting import UnknownVersion, upcast


class ContractError(ValueError):
    """A message that does not satisfy the contract; the message says what is wrong."""


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    type: str
    version: int
    occurred_at: str
    workspace: str
    correlation_id: str
    causation_id: str | None = None
    data: msgspec.Raw = msgspec.Raw(b"{}")

    @property
    def subject(self) -> str:
        cls = EVENT_TYPES[self.type]
        body = msgspec.json.decode(self.data)
        return subjects.subject(self.workspace, cls.AGGREGATE, body[cls.ID_FIELD], self.type)


class Message(msgspec.Struct, frozen=True):
    """A decoded message: the envelope, its body as a current-version event, and its subject."""
    envelope: Envelope
    event: Event
    subject: str


_envelope_decoder = msgspec.json.Decoder(Envelope)
_encoder = msgspec.json.Encoder()
_decoders = {name: msgspec.json.Decoder(cls) for name, cls in EVENT_TYPES.items()}


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def workspace_for(event: Event, workspace: str) -> str:
    return SYSTEM_WORKSPACE if event.SYSTEM else workspace


def envelope(event: Event, *, workspace: str, correlation_id: str | None = None,
             causation_id: str | None = None, id: str | None = None) -> Envelope:
    """Wrap an event. Without a correlation id the event starts a new correlation (its own id)."""
    event_id = id or uuid7()
    ws = workspace_for(event, workspace)
    check_workspace(ws)
    body = _encoder.encode(msgspec.structs.asdict(event))
    env = Envelope(id=event_id, type=type(event).__name__, version=event.VERSION, occurred_at=now_iso(),
                   workspace=ws, correlation_id=correlation_id or event_id, causation_id=causation_id,
                   data=msgspec.Raw(body))
    subject_of(env, event)  # validates the aggregate id before anything is published
    return env


def caused_by(cause: Envelope, event: Event, *, id: str | None = None) -> Envelope:
    """An event caused by another: same correlation, causation = the cause's id."""
    return envelope(event, workspace=cause.workspace if cause.workspace != SYSTEM_WORKSPACE else "default",
                    correlation_id=cause.correlation_id, causation_id=cause.id, id=id)


def subject_of(env: Envelope, event: Event) -> str:
    try:
        return subjects.subject(env.workspace, event.AGGREGATE, event.aggregate_id, env.type)
    except InvalidName as exc:
        raise ContractError(str(exc)) from None


def encode(env: Envelope) -> bytes:
    return _encoder.encode(env)


def decode(payload: bytes, subject: str | None = None) -> Message:
    """Decode and validate a message; raise ContractError with the reason when it is not valid.

    With `subject`, the subject the message arrived on must be the one its envelope implies: a
    publisher cannot put one workspace's event on another workspace's subject.
    """
    try:
        env = _envelope_decoder.decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # msgspec lets some invalid UTF-8 through
        raise ContractError(f"envelope does not decode: {exc}") from None
    if not UUID_RE.fullmatch(env.id):
        raise ContractError(f"envelope id {env.id!r} is not a lowercase UUID")
    cls = EVENT_TYPES.get(env.type)
    if cls is None:
        raise ContractError(f"unknown event type {env.type!r}")
    try:
        check_workspace(env.workspace)
    except InvalidName as exc:
        raise ContractError(str(exc)) from None
    if cls.SYSTEM != (env.workspace == SYSTEM_WORKSPACE):
        raise ContractError(f"{env.type} belongs to workspace "
                            f"{'_sys' if cls.SYSTEM else 'of a tenant, not _sys'}, got {env.workspace!r}")
    try:
        if env.version == cls.VERSION:
            event = _decoders[env.type].decode(env.data)
        else:
            body = upcast(env.type, env.version, cls.VERSION, msgspec.json.decode(env.data))
            event = msgspec.convert(body, cls)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:  # Raw keeps bad UTF-8
        raise ContractError(f"{env.type} v{env.version} body is not valid: {exc}") from None
    except UnknownVersion as exc:
        raise ContractError(str(exc)) from None
    expected = subject_of(env, event)
    if subject is not None and subject != expected:
        raise ContractError(f"subject {subject!r} does not match the envelope (expected {expected!r})")
    return Message(env, event, expected)
