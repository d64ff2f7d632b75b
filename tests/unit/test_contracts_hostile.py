"""Whatever bytes arrive on the stream, `decode` either returns a message or raises ContractError
(which consumers dead-letter): any other exception would stop a projection on one poison message.
Found by the event fuzzer: invalid UTF-8 inside the body raised UnicodeDecodeError."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts import ContractError, decode, encode, envelope
from levers9.contracts import events as E

SUBJECT = "levers9.default.container.c1.ContainerStopRequested"
VALID = encode(envelope(E.ContainerStopRequested(container_id="c1", reason="@@"), workspace="default"))


def decodes_or_refuses(payload: bytes, subject: str = SUBJECT) -> None:
    try:
        decode(payload, subject)
    except ContractError:
        pass


def test_invalid_utf8_in_a_body_string_is_a_contract_error():
    for bad in (b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80"):
        try:
            decode(VALID.replace(b"@@", bad), SUBJECT)
        except ContractError as exc:
            assert "not valid" in str(exc)
        else:
            raise AssertionError(f"{bad!r} decoded")


@given(st.binary(max_size=64))
def test_any_bytes_in_a_body_string_decode_or_are_refused(inner):
    decodes_or_refuses(VALID.replace(b"@@", inner))


@given(st.binary(max_size=512))
def test_any_payload_decodes_or_is_refused(payload):
    decodes_or_refuses(payload)


@given(st.integers(0, len(VALID) - 1), st.binary(min_size=1, max_size=8))
def test_a_valid_event_with_bytes_overwritten_decodes_or_is_refused(at, junk):
    decodes_or_refuses(VALID[:at] + junk + VALID[at + len(junk):])
