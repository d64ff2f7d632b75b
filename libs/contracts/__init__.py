"""levers9.contracts: events, the envelope, subjects and schemas. No I/O."""

from . import events, subjects
from .envelope import ContractError, Envelope, Message, caused_by, decode, encode, envelope
from .events import EVENT_TYPES, AnyEvent, Event
from .ids import SYSTEM_WORKSPACE, InvalidName, check_id, check_workspace, uuid7

__all__ = ["events", "subjects", "ContractError", "Envelope", "Message", "caused_by", "decode", "encode",
           "envelope", "EVENT_TYPES", "AnyEvent", "Event", "SYSTEM_WORKSPACE", "InvalidName", "check_id",
           "check_workspace", "uuid7"]
