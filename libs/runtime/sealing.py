"""Envelope encryption: AES-256-GCM under a fresh data key (DEK) per value or archive, the DEK
wrapped by a key encryption key (KEK) of a keyring. Pure functions over bytes and strings, no I/O
(loading the keyring from a file or the environment is levers9.runtime.secrets).

Two formats, both versioned, both binding a *context* (where the value belongs: a workspace and
secret name, an S3 location) into every GCM tag, so a ciphertext copied elsewhere does not open:

1. A value (a secret), text, fits a JSON string:

       l9s1:<kek_id>:<b64url(wrap_nonce ‖ wrapped_dek)>:<b64url(nonce ‖ ciphertext ‖ tag)>

   wrapped_dek = AESGCM(KEK).encrypt(wrap_nonce, dek, "levers9/dek/v1|<kek_id>|<context>")
   ciphertext  = AESGCM(dek).encrypt(nonce, value, "levers9/value/v1|<context>")

2. An archive (a checkpoint tar), streamed in segments so that a 1 GB dump never sits in memory:

       "L9SEAL01" ‖ u32be(len(header)) ‖ header ‖ segment_0 ‖ … ‖ segment_n

   header = JSON {"v": 1, "alg": "AES-256-GCM", "kek": id, "dek": b64(wrap_nonce ‖ wrapped_dek),
   "prefix": b64(8 random bytes), "segment": plaintext bytes per segment}. Segment i is
   AESGCM(dek).encrypt(prefix ‖ u32be(i), plaintext_i, header ‖ final_flag): every segment but the
   last holds exactly `segment` bytes; the last (flag 1, possibly empty) proves nothing was cut off;
   the header is authenticated by every tag.

Rotation: a keyring has one primary KEK (new values) and older ones (still opened); `rewrap` moves a
value's DEK to the primary without touching the value's ciphertext.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Callable, Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

VALUE_PREFIX = "l9s1"
MAGIC = b"L9SEAL01"
SEGMENT = 1 << 20
TAG = 16
KEY_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class SealError(ValueError):
    """A sealed value or archive cannot be opened. The message never holds plaintext."""


class UnknownKey(SealError):
    pass


class Tampered(SealError):
    pass


@dataclass(frozen=True)
class Keyring:
    primary: str
    keys: Mapping[str, bytes] = field(repr=False)  # never printed: a repr of a Keyring shows ids only

    def __post_init__(self) -> None:
        if self.primary not in self.keys:
            raise SealError(f"the keyring's primary key {self.primary!r} is not among its keys {sorted(self.keys)}")
        for kid, key in self.keys.items():
            if not KEY_ID_RE.fullmatch(kid) or len(key) != 32:
                raise SealError(f"key {kid!r} is not valid: ids are [A-Za-z0-9_-]{{1,64}}, keys 32 bytes")

    def kek(self, kid: str) -> bytes:
        try:
            return self.keys[kid]
        except KeyError:
            raise UnknownKey(f"sealed under key {kid!r}, which this keyring ({', '.join(sorted(self.keys))}) "
                             "does not hold: was it retired, or is this process given another key?") from None


# ---- keys ---------------------------------------------------------------------------------------

def new_kek() -> bytes:
    return AESGCM.generate_key(bit_length=256)


def key_id(key: bytes) -> str:
    """A key's id: a fingerprint (48 bits of a domain-separated sha256), stable and not reversible."""
    return "k" + hashlib.sha256(b"levers9/kek-id/v1|" + key).hexdigest()[:12]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    text = text.strip().replace("+", "-").replace("/", "_")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _unb64_exact(text: str) -> bytes:
    """What _b64 wrote, and nothing else: base64's last character carries spare bits, so another
    character there can decode to the same bytes; a sealed value so altered is refused too."""
    data = _unb64(text)
    if _b64(data) != text:  # also refuses what _unb64 forgives: spaces, "+" and "/"
        raise ValueError("not the canonical base64 of its bytes")
    return data


def parse_keyring(text: str) -> Keyring:
    """A keyring from its text: JSON {"primary": id, "keys": {id: base64}}, or `id:base64,id:base64`
    (the first is primary), or one bare base64 key (its id is its fingerprint)."""
    text = text.strip()
    if not text:
        raise SealError("the keyring is empty")
    try:
        if text.startswith("{"):
            data = json.loads(text)
            return Keyring(str(data["primary"]), {str(k): _unb64(v) for k, v in data["keys"].items()})
        if ":" not in text:
            key = _unb64(text)
            return Keyring(key_id(key), {key_id(key): key})
        pairs = [p.split(":", 1) for p in text.split(",") if p.strip()]
        return Keyring(pairs[0][0].strip(), {k.strip(): _unb64(v) for k, v in pairs})
    except SealError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise SealError(f"the keyring cannot be read ({type(exc).__name__}): expected JSON "
                        '{"primary": ID, "keys": {ID: BASE64}}, `ID:BASE64,…` or one base64 key') from None


def dump_keyring(ring: Keyring) -> str:
    return json.dumps({"v": 1, "primary": ring.primary, "keys": {k: _b64(v) for k, v in ring.keys.items()}},
                      indent=2) + "\n"


def rotated(ring: Keyring | None, key: bytes | None = None) -> Keyring:
    """The keyring with a new primary KEK; the old keys stay, so what they sealed still opens."""
    key = key or new_kek()
    keys = dict(ring.keys) if ring else {}
    keys[key_id(key)] = key
    return Keyring(key_id(key), keys)


def retired(ring: Keyring, kid: str) -> Keyring:
    if kid == ring.primary:
        raise SealError(f"{kid!r} is the primary key: rotate first (`levers9 secret rotate-key`)")
    ring.kek(kid)
    return Keyring(ring.primary, {k: v for k, v in ring.keys.items() if k != kid})


# ---- the DEK ------------------------------------------------------------------------------------

def _wrap_aad(kid: str, context: str) -> bytes:
    return f"levers9/dek/v1|{kid}|{context}".encode()


def _wrap(ring: Keyring, dek: bytes, context: str) -> tuple[str, bytes]:
    nonce = os.urandom(12)
    return ring.primary, nonce + AESGCM(ring.kek(ring.primary)).encrypt(nonce, dek, _wrap_aad(ring.primary, context))


def _unwrap(ring: Keyring, kid: str, wrapped: bytes, context: str) -> bytes:
    kek = ring.kek(kid)
    try:
        return AESGCM(kek).decrypt(wrapped[:12], wrapped[12:], _wrap_aad(kid, context))
    except (InvalidTag, ValueError):
        raise Tampered(f"the data key (under key {kid!r}) fails its integrity check: the ciphertext was altered, "
                       "or it belongs to another secret/location than this one") from None


# ---- values -------------------------------------------------------------------------------------

def seal_value(ring: Keyring, plaintext: str, context: str) -> str:
    dek = AESGCM.generate_key(bit_length=256)
    kid, wrapped = _wrap(ring, dek, context)
    nonce = os.urandom(12)
    body = nonce + AESGCM(dek).encrypt(nonce, plaintext.encode(), f"levers9/value/v1|{context}".encode())
    return f"{VALUE_PREFIX}:{kid}:{_b64(wrapped)}:{_b64(body)}"


def _parse_value(token: str) -> tuple[str, bytes, bytes]:
    parts = token.split(":")
    if len(parts) != 4 or parts[0] != VALUE_PREFIX:
        if token.startswith("gAAAA"):  # Fernet's version byte 0x80, base64
            raise SealError("this secret was stored by an older levers9 (Fernet, before envelope encryption) and "
                            "cannot be opened any more: set it again with `levers9 secret create NAME VALUE`")
        raise SealError(f"not a sealed value of a known format (expected {VALUE_PREFIX}:KEY_ID:DEK:BODY)")
    try:
        return parts[1], _unb64_exact(parts[2]), _unb64_exact(parts[3])
    except ValueError:
        raise Tampered("a sealed value is not valid base64: it was altered") from None


def value_key_id(token: str) -> str:
    """The id of the KEK a sealed value's DEK is wrapped under."""
    return _parse_value(token)[0]


def open_value(ring: Keyring, token: str, context: str) -> str:
    kid, wrapped, body = _parse_value(token)
    dek = _unwrap(ring, kid, wrapped, context)
    try:
        return AESGCM(dek).decrypt(body[:12], body[12:], f"levers9/value/v1|{context}".encode()).decode()
    except (InvalidTag, ValueError):
        raise Tampered("a sealed value fails its integrity check: it was altered, or it belongs to another "
                       "secret than this one") from None


def rewrap_value(ring: Keyring, token: str, context: str) -> str:
    """The same value with its DEK wrapped under the primary KEK (the value's ciphertext unchanged)."""
    kid, wrapped, body = _parse_value(token)
    if kid == ring.primary:
        return token
    new_kid, new_wrapped = _wrap(ring, _unwrap(ring, kid, wrapped, context), context)
    return f"{VALUE_PREFIX}:{new_kid}:{_b64(new_wrapped)}:{_b64(body)}"


# ---- archives (streamed) ------------------------------------------------------------------------

def is_sealed_archive(head: bytes) -> bool:
    return head[:len(MAGIC)] == MAGIC


class ArchiveSealer:
    """Seal a stream: `header()` once, `update(chunk)` per chunk, `finish()` at the end; the
    concatenation of what they return is the sealed archive."""

    def __init__(self, ring: Keyring, context: str, segment: int = SEGMENT) -> None:
        dek = AESGCM.generate_key(bit_length=256)
        kid, wrapped = _wrap(ring, dek, context)
        self.aead, self.segment, self.prefix, self.index = AESGCM(dek), segment, os.urandom(8), 0
        header = json.dumps({"v": 1, "alg": "AES-256-GCM", "kek": kid, "dek": _b64(wrapped),
                             "prefix": _b64(self.prefix), "segment": segment}, sort_keys=True).encode()
        self.header_bytes = MAGIC + struct.pack(">I", len(header)) + header
        self.buffer = bytearray()

    def header(self) -> bytes:
        return self.header_bytes

    def _seal(self, data: bytes | memoryview, final: bool) -> bytes:
        nonce = self.prefix + struct.pack(">I", self.index)
        self.index += 1
        return self.aead.encrypt(nonce, data, self.header_bytes + (b"\x01" if final else b"\x00"))

    def update(self, chunk: bytes) -> bytes:
        self.buffer += chunk
        # keep at least one byte back: the last segment must be sealed as the final one
        return _segments(self.buffer, self.segment, self._seal)

    def finish(self) -> bytes:
        out = self._seal(bytes(self.buffer), final=True)
        self.buffer.clear()
        return out


class ArchiveOpener:
    """Open a sealed stream: `update(chunk)` per chunk returns plaintext as it is authenticated,
    `finish()` checks the final segment (a truncated archive raises Tampered)."""

    def __init__(self, ring: Keyring | None, context: str, data_key: bytes | None = None) -> None:
        """`data_key`: the archive's own key, given by a holder of the keyring (a worker without one
        gets it from the gateway for one checkpoint); otherwise unwrapped here with `ring`."""
        self.ring, self.context, self.data_key = ring, context, data_key
        self.buffer = bytearray()
        self.aead: AESGCM | None = None
        self.header_bytes = b""
        self.prefix, self.segment, self.index = b"", 0, 0

    def _read_header(self) -> bool:
        if len(self.buffer) < len(MAGIC) + 4:
            return False
        if not is_sealed_archive(bytes(self.buffer)):
            raise SealError("not a sealed archive (no L9SEAL01 magic)")
        (size,) = struct.unpack(">I", self.buffer[len(MAGIC):len(MAGIC) + 4])
        if size > 64 * 1024:
            raise Tampered(f"a sealed archive's header claims {size} bytes: it was altered")
        end = len(MAGIC) + 4 + size
        if len(self.buffer) < end:
            return False
        self.header_bytes = bytes(self.buffer[:end])
        try:
            header = json.loads(self.header_bytes[len(MAGIC) + 4:])
            if header.get("v") != 1 or header.get("alg") != "AES-256-GCM":
                raise SealError(f"a sealed archive of an unknown version {header.get('v')!r}/{header.get('alg')!r}")
            wrapped, self.prefix = _unb64_exact(header["dek"]), _unb64_exact(header["prefix"])
            self.segment = int(header["segment"])
            kid = str(header["kek"])
        except (ValueError, KeyError, TypeError) as exc:
            raise Tampered(f"a sealed archive's header cannot be read ({type(exc).__name__}): it was altered") from None
        if self.segment <= 0 or len(self.prefix) != 8:
            raise Tampered("a sealed archive's header is not valid: it was altered")
        if self.data_key is None:
            if self.ring is None:
                raise SealError("a sealed archive needs the secrets keyring or its data key to open")
            self.data_key = _unwrap(self.ring, kid, wrapped, self.context)
        self.aead = AESGCM(self.data_key)
        del self.buffer[:end]
        return True

    def _open(self, data: bytes | memoryview, final: bool) -> bytes:
        assert self.aead is not None
        nonce = self.prefix + struct.pack(">I", self.index)
        self.index += 1
        try:
            return self.aead.decrypt(nonce, data, self.header_bytes + (b"\x01" if final else b"\x00"))
        except InvalidTag:
            raise Tampered(f"segment {self.index - 1} of a sealed archive fails its integrity check (AES-GCM tag): "
                           "the archive was altered, truncated or moved from its location") from None

    def update(self, chunk: bytes) -> bytes:
        self.buffer += chunk
        if self.aead is None and not self._read_header():
            return b""
        # a segment with more after it is not the final one
        return _segments(self.buffer, self.segment + TAG, self._open)

    def finish(self) -> bytes:
        if self.aead is None:
            raise Tampered("a sealed archive ends inside its header: it was truncated")
        out = self._open(bytes(self.buffer), final=True)
        self.buffer.clear()
        return out


def _segments(buffer: bytearray, size: int, each: Callable[[memoryview, bool], bytes]) -> bytes:
    """`each` over the whole segments of `buffer` that have at least one byte after them (so none
    of them is the final one), without copying them out; they leave the buffer."""
    n = (len(buffer) - 1) // size if buffer else 0
    if n <= 0:
        return b""
    with memoryview(buffer) as view:
        out = b"".join([each(view[i * size:(i + 1) * size], False) for i in range(n)])
    del buffer[:n * size]
    return out


def seal_archive(ring: Keyring, data: bytes, context: str, segment: int = SEGMENT) -> bytes:
    s = ArchiveSealer(ring, context, segment)
    return s.header() + s.update(data) + s.finish()


def open_archive(ring: Keyring, data: bytes, context: str) -> bytes:
    o = ArchiveOpener(ring, context)
    return o.update(data) + o.finish()


HEADER_MAX = len(MAGIC) + 4 + 64 * 1024  # the most a sealed archive's header may take


def archive_data_key(ring: Keyring, head: bytes, context: str) -> bytes:
    """The data key of the sealed archive whose first bytes (at least its header) are `head`: what a
    holder of the keyring hands a worker without one, to open that one archive and nothing else."""
    opener = ArchiveOpener(ring, context)
    opener.buffer += head
    if not opener._read_header():
        raise Tampered("a sealed archive ends inside its header: it was truncated")
    assert opener.data_key is not None
    return opener.data_key
