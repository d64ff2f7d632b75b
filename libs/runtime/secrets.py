"""Secrets at rest: where the key encryption keys (KEKs) come from, and the one way secrets and
checkpoint archives are sealed and opened (the formats are in levers9.runtime.sealing).

The keyring is `LEVERS9_SECRET_KEY` (inline: JSON, `ID:BASE64,…` with the primary first, or one
bare base64 key) or else the file named by `LEVERS9_SECRET_KEY_FILE` (`levers9 up` writes
`$LEVERS9_HOME/secret-keys.json`, mode 0600, and names it in the profile). The file is read again
whenever it changes, so `levers9 secret rotate-key` takes effect in running services without a
restart. Only the gateway (seals what users set), the workers (open into a container's
environment, open checkpoints fetched from S3) and the checkpoint-store (seals checkpoints before
they go to S3) need it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from . import sealing
from .config import Settings
from .sealing import Keyring, SealError

KEYRING_FILE = "secret-keys.json"


class SecretKeyMissing(RuntimeError):
    pass


class SecretUnreadable(RuntimeError):
    """A stored secret cannot be opened; the message names the secret and why, never its value."""


_lock = threading.Lock()
_cache: dict[str, tuple[float, int, Keyring]] = {}


def keyring(settings: Settings) -> Keyring:
    """This process's keyring (the file is re-read when its mtime or size changes)."""
    if settings.secrets.key:
        try:
            return sealing.parse_keyring(settings.secrets.key)
        except SealError as exc:
            raise SecretKeyMissing(f"LEVERS9_SECRET_KEY is not a valid keyring: {exc}") from None
    if not settings.secrets.key_file:
        raise SecretKeyMissing("no key encryption key: set LEVERS9_SECRET_KEY_FILE (a keyring file, "
                               "`levers9 up` writes one) or LEVERS9_SECRET_KEY")
    return _from_file(Path(settings.secrets.key_file))


def _from_file(path: Path) -> Keyring:
    try:
        st = path.stat()
    except OSError as exc:
        raise SecretKeyMissing(f"the keyring file {path} cannot be read: {exc.strerror}") from None
    with _lock:
        cached = _cache.get(str(path))
        if cached and cached[0] == st.st_mtime and cached[1] == st.st_size:
            return cached[2]
        try:
            ring = sealing.parse_keyring(path.read_text())
        except (OSError, SealError) as exc:
            raise SecretKeyMissing(f"the keyring file {path} is not valid: {exc}") from None
        _cache[str(path)] = (st.st_mtime, st.st_size, ring)
        return ring


def write_keyring(path: Path, ring: Keyring) -> None:
    """Write the keyring file atomically, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(sealing.dump_keyring(ring))
    os.replace(tmp, path)


def secret_context(workspace: str, name: str) -> str:
    """What a secret's ciphertext is bound to: it opens as this workspace's secret of this name only."""
    return f"secret/{workspace}/{name}"


def checkpoint_context(bucket: str, key: str) -> str:
    """What a sealed checkpoint archive is bound to: its S3 location."""
    return f"s3://{bucket}/{key}"


def encrypt(settings: Settings, workspace: str, name: str, value: str) -> str:
    return sealing.seal_value(keyring(settings), value, secret_context(workspace, name))


def decrypt(settings: Settings, workspace: str, name: str, ciphertext: str) -> str:
    try:
        return sealing.open_value(keyring(settings), ciphertext, secret_context(workspace, name))
    except SealError as exc:
        raise SecretUnreadable(f"secret {name!r} of workspace {workspace!r} cannot be decrypted: {exc}") from None


def rewrap(settings: Settings, workspace: str, name: str, ciphertext: str) -> str:
    try:
        return sealing.rewrap_value(keyring(settings), ciphertext, secret_context(workspace, name))
    except SealError as exc:
        raise SecretUnreadable(f"secret {name!r} of workspace {workspace!r} cannot be rewrapped: {exc}") from None
