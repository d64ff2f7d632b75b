"""Envelope encryption of secrets and checkpoint archives (levers9.runtime.sealing, .secrets):
round trips, tampering, wrong keys, moved ciphertexts, rotation and rewrap, truncation."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.runtime import sealing
from levers9.runtime import secrets as S
from levers9.runtime.config import Settings
from levers9.runtime.sealing import (
    ArchiveOpener,
    ArchiveSealer,
    SealError,
    Tampered,
    UnknownKey,
    open_archive,
    open_value,
    rewrap_value,
    rotated,
    seal_archive,
    seal_value,
)

RING = rotated(None)
CANARY = "canary-7f3c9e"


@given(st.text(max_size=300), st.text(min_size=1, max_size=40))
@settings(max_examples=60)
def test_a_value_round_trips_and_its_ciphertext_holds_no_plaintext(value, context):
    token = seal_value(RING, value, context)
    assert open_value(RING, token, context) == value
    assert token.startswith(f"l9s1:{RING.primary}:")
    if len(value) >= 4:
        assert value not in token


def test_two_seals_of_one_value_differ():
    assert seal_value(RING, CANARY, "c") != seal_value(RING, CANARY, "c")


@given(st.data())
@settings(max_examples=60)
def test_any_altered_character_is_refused_without_the_value(data):
    token = seal_value(RING, CANARY, "secret/acme/API_KEY")
    prefix = len(f"l9s1:{RING.primary}:")
    i = data.draw(st.integers(prefix, len(token) - 1))
    if token[i] == ":":
        return
    repl = data.draw(st.sampled_from([c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
                                      if c != token[i]]))
    bad = token[:i] + repl + token[i + 1:]
    with pytest.raises(SealError) as err:
        open_value(RING, bad, "secret/acme/API_KEY")
    assert CANARY not in str(err.value)


def test_a_last_character_that_decodes_to_the_same_bytes_is_refused_too():
    """base64's last character carries spare bits: found by the property above (Draw 1: 154)."""
    import base64

    token = seal_value(RING, CANARY, "c")
    body = token.rsplit(":", 1)[1]
    assert len(body) % 4, "the body must end in a partial quantum for spare bits to exist"
    same = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" if c != body[-1]
            and base64.urlsafe_b64decode(body[:-1] + c + "=" * (-len(body) % 4))
            == base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))]
    assert same
    with pytest.raises(Tampered, match="altered"):
        open_value(RING, token[:-1] + same[0], "c")


def test_a_ciphertext_moved_to_another_secret_or_workspace_does_not_open():
    token = seal_value(RING, CANARY, S.secret_context("acme", "API_KEY"))
    for other in (S.secret_context("acme", "OTHER"), S.secret_context("evil", "API_KEY")):
        with pytest.raises(Tampered, match="another"):
            open_value(RING, token, other)


def test_a_wrong_kek_is_a_clear_error():
    token = seal_value(RING, CANARY, "c")
    other = rotated(None)
    with pytest.raises(UnknownKey, match=RING.primary) as err:
        open_value(other, token, "c")
    assert CANARY not in str(err.value)
    # the same id with another key (a replaced key file) fails the data key's tag
    impostor = sealing.Keyring(RING.primary, {RING.primary: os.urandom(32)})
    with pytest.raises(Tampered):
        open_value(impostor, token, "c")


def test_rotation_keeps_old_values_readable_and_rewrap_moves_them_to_the_new_key():
    old_token = seal_value(RING, CANARY, "c")
    ring2 = rotated(RING)
    assert ring2.primary != RING.primary and set(RING.keys) < set(ring2.keys)
    assert open_value(ring2, old_token, "c") == CANARY
    new_token = rewrap_value(ring2, old_token, "c")
    assert sealing.value_key_id(new_token) == ring2.primary
    assert new_token.split(":")[3] == old_token.split(":")[3]  # the value's ciphertext is untouched
    assert rewrap_value(ring2, new_token, "c") == new_token
    retired = sealing.retired(ring2, RING.primary)
    assert open_value(retired, new_token, "c") == CANARY
    with pytest.raises(UnknownKey, match="retired"):
        open_value(retired, old_token, "c")
    with pytest.raises(SealError, match="primary"):
        sealing.retired(ring2, ring2.primary)


def test_a_fernet_value_of_an_older_levers9_is_refused_clearly():
    from cryptography.fernet import Fernet

    token = Fernet(Fernet.generate_key()).encrypt(CANARY.encode()).decode()
    with pytest.raises(SealError, match="older levers9.*levers9 secret create"):
        open_value(RING, token, "c")


def test_keyring_texts_parse_and_dump():
    key = os.urandom(32)
    bare = sealing.parse_keyring(sealing._b64(key))
    assert bare.primary == sealing.key_id(key) and bare.keys[bare.primary] == key
    ring2 = rotated(bare)
    assert sealing.parse_keyring(sealing.dump_keyring(ring2)) == ring2
    inline = sealing.parse_keyring(f"new:{sealing._b64(os.urandom(32))},old:{sealing._b64(key)}")
    assert inline.primary == "new" and inline.keys["old"] == key
    assert sealing._b64(key) not in repr(ring2)
    # a profile of an older levers9 holds a Fernet key: 32 bytes, so it still works as a KEK
    from cryptography.fernet import Fernet
    legacy = sealing.parse_keyring(Fernet.generate_key().decode())
    assert open_value(legacy, seal_value(legacy, CANARY, "c"), "c") == CANARY
    for bad in ("", "{}", "a:bm90MzJieXRlcw", '{"primary": "x", "keys": {"y": "AAAA"}}', "!!"):
        with pytest.raises(SealError):
            sealing.parse_keyring(bad)


def test_the_keyring_file_is_reread_when_it_changes(tmp_path):
    path = tmp_path / "keys.json"
    s = Settings().with_(secret_key_file=str(path))
    with pytest.raises(S.SecretKeyMissing, match="cannot be read"):
        S.keyring(s)
    S.write_keyring(path, RING)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    token = S.encrypt(s, "acme", "API_KEY", CANARY)
    S.write_keyring(path, rotated(RING))
    assert S.keyring(s).primary != RING.primary
    assert S.decrypt(s, "acme", "API_KEY", token) == CANARY
    with pytest.raises(S.SecretUnreadable, match="'API_KEY' of workspace 'evil'") as err:
        S.decrypt(s, "evil", "API_KEY", token)
    assert CANARY not in str(err.value)
    with pytest.raises(S.SecretKeyMissing, match="LEVERS9_SECRET_KEY_FILE"):
        S.keyring(Settings())


@given(st.binary(max_size=5000), st.integers(1, 700), st.lists(st.integers(1, 900), min_size=1, max_size=8))
@settings(max_examples=80)
def test_an_archive_round_trips_whatever_the_segment_and_chunk_sizes(data, segment, cuts):
    sealed = seal_archive(RING, data, "s3://b/k", segment=segment)
    assert sealing.is_sealed_archive(sealed)
    opener, out, i = ArchiveOpener(RING, "s3://b/k"), bytearray(), 0
    for n in cuts * (len(sealed) // max(1, sum(cuts)) + 1):
        out += opener.update(sealed[i:i + n])
        i += n
        if i >= len(sealed):
            break
    out += opener.update(sealed[i:])
    assert bytes(out + opener.finish()) == data


@given(st.data())
@settings(max_examples=60)
def test_a_flipped_byte_truncation_or_move_of_an_archive_is_refused(data):
    plain = os.urandom(3000)
    sealed = seal_archive(RING, plain, "s3://b/k", segment=512)
    i = data.draw(st.integers(0, len(sealed) - 1))
    flipped = sealed[:i] + bytes([sealed[i] ^ data.draw(st.integers(1, 255))]) + sealed[i + 1:]
    with pytest.raises(SealError):
        open_archive(RING, flipped, "s3://b/k")
    cut = data.draw(st.integers(0, len(sealed) - 1))
    with pytest.raises(SealError):
        open_archive(RING, sealed[:cut], "s3://b/k")


def test_an_archive_of_an_exact_number_of_segments_and_an_empty_one():
    for plain in (b"", os.urandom(1024)):
        s = ArchiveSealer(RING, "ctx", segment=512)
        sealed = s.header() + s.update(plain) + s.finish()
        assert open_archive(RING, sealed, "ctx") == plain
    sealed = seal_archive(RING, b"x" * 1024, "ctx", segment=512)
    with pytest.raises(Tampered, match="another secret/location"):
        open_archive(RING, sealed, "s3://elsewhere")
    with pytest.raises(UnknownKey):
        open_archive(rotated(None), sealed, "ctx")
    # dropping the final segment leaves a full non-final one last: refused as truncated
    whole = 512 + sealing.TAG
    with pytest.raises(Tampered):
        open_archive(RING, sealed[:-whole], "ctx")


@given(st.binary(max_size=3000), st.integers(0, 200))
@settings(max_examples=40)
def test_an_archive_s_data_key_from_its_header_opens_that_archive_only(data, extra):
    """What the gateway gives a worker without the keyring: the key of one archive, from its header."""
    sealed = seal_archive(RING, data, "s3://b/k", segment=256)
    header_end = len(sealing.MAGIC) + 4 + int.from_bytes(sealed[len(sealing.MAGIC):len(sealing.MAGIC) + 4], "big")
    key = sealing.archive_data_key(RING, sealed[:header_end + extra], "s3://b/k")
    assert len(key) == 32 and key not in (RING.kek(k) for k in RING.keys)
    opener = ArchiveOpener(None, "s3://b/k", key)
    assert opener.update(sealed) + opener.finish() == data
    other = seal_archive(RING, data or b"x", "s3://b/k", segment=256)  # another archive: another key
    with pytest.raises(Tampered):
        o = ArchiveOpener(None, "s3://b/k", key)
        o.update(other)
        o.finish()
    with pytest.raises(Tampered, match="truncated"):
        sealing.archive_data_key(RING, sealed[:header_end - 1], "s3://b/k")
    with pytest.raises(Tampered, match="another secret/location"):
        sealing.archive_data_key(RING, sealed, "s3://b/elsewhere")
    with pytest.raises(SealError, match="keyring or its data key"):
        ArchiveOpener(None, "s3://b/k").update(sealed)
