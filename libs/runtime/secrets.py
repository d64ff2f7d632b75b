"""Secret values are encrypted before they enter the log (Fernet, key LEVERS9_SECRET_KEY); only
processes given the key (the gateway that writes, the workers that inject) can read them."""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken


class SecretKeyMissing(RuntimeError):
    pass


def new_key() -> str:
    return Fernet.generate_key().decode()


def _fernet(key: str) -> Fernet:
    if not key:
        raise SecretKeyMissing("LEVERS9_SECRET_KEY is not set: `levers9 up` writes one to the profile")
    return Fernet(key.encode())


def encrypt(key: str, value: str) -> str:
    return _fernet(key).encrypt(value.encode()).decode()


def decrypt(key: str, ciphertext: str) -> str:
    try:
        return _fernet(key).decrypt(ciphertext.encode()).decode()
    except InvalidToken:
        raise SecretKeyMissing("a secret cannot be decrypted with this LEVERS9_SECRET_KEY") from None
