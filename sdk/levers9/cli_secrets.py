"""`levers9 secret rotate-key`: a new primary key encryption key in the secrets keyring file, the
stored secrets rewrapped under it by the gateway (`--rewrap`), and the old keys dropped once
nothing stored uses them (`--retire-old`). `register()` adds it to the `levers9 secret` group.

Run it where the keyring file is (the profile's `secret_key_file`; `levers9 up` writes
`$LEVERS9_HOME/secret-keys.json`). Services re-read the file when it changes: no restart.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.markup import escape

from levers9.cli_app import secret_app
from levers9.cli_output import client, console, errors, fail
from levers9.runtime.config import Settings, write_profile
from levers9.runtime.secrets import KEYRING_FILE, SecretKeyMissing, keyring, write_keyring


def ensure_keyring(s: Settings, profile: Path) -> bool:
    """Write a new keyring file and name it in the profile unless a keyring is configured
    (`levers9 up`); True when it wrote one."""
    from levers9.runtime.sealing import rotated

    if s.secrets.key or s.secrets.key_file:
        return False
    path = s.home_path / KEYRING_FILE
    if not path.exists():
        write_keyring(path, rotated(None))
    write_profile(profile, {"secret_key_file": str(path)})
    return True


def rotate_key(rewrap: bool = typer.Option(False, "--rewrap", help="rewrap every stored secret under the new key"),
               retire_old: bool = typer.Option(False, "--retire-old",
                                               help="with --rewrap: drop the old keys once no stored secret uses them "
                                                    "(checkpoints sealed under them can no longer be restored)")) -> None:
    """Make a new key encryption key the primary one; old keys stay, so old values still open."""
    from levers9.runtime.sealing import rotated

    s = Settings.load()
    if s.secrets.key:
        fail("the keyring is given inline (LEVERS9_SECRET_KEY): rotate it where it is set, or use a keyring file "
             "(LEVERS9_SECRET_KEY_FILE) that this command can rewrite")
    if not s.secrets.key_file:
        fail("no keyring file is configured: `levers9 up` writes one, or set LEVERS9_SECRET_KEY_FILE")
    if retire_old and not rewrap:
        fail("--retire-old needs --rewrap: a key may go only once no stored secret uses it")
    path = Path(s.secrets.key_file)
    try:
        old = keyring(s)
    except SecretKeyMissing as exc:
        fail(str(exc))
    new = rotated(old)
    write_keyring(path, new)
    console.print(f"new primary key {new.primary} in {escape(str(path))}; kept: {', '.join(sorted(old.keys))}")
    if not rewrap:
        return
    with errors():
        done = client().rewrap_secrets()
    if done["primary"] != new.primary:
        fail(f"the gateway's primary key is {done['primary']}, not {new.primary}: it reads another keyring; "
             "give it this file, then run `levers9 secret rotate-key --rewrap` again")
    console.print(f"rewrapped {done['rewrapped']} of {done['secrets']} stored secrets")
    for f in done["failed"]:
        console.print(f"  not rewrapped: {escape(f['workspace'])}/{escape(f['name'])}: {escape(f['reason'])}")
    if retire_old:
        _retire(path, new.primary, sorted(set(old.keys) - {new.primary}))


def _retire(path: Path, primary: str, old: list[str]) -> None:
    """Drop the old keys once the gateway's view shows no stored secret under them (its view
    follows the rewrap events within moments)."""
    from levers9.runtime.sealing import retired

    deadline = time.monotonic() + 30
    while True:
        with errors():
            used = client().secret_keys()["by_key"]
        busy = [k for k in old if used.get(k)]
        if not busy or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    s = Settings.load()
    ring = keyring(s)
    for kid in old:
        if kid in busy:
            console.print(f"kept key {kid}: {used[kid]} stored secret(s) still use it")
        elif kid in ring.keys:
            ring = retired(ring, kid)
            console.print(f"retired key {kid}")
    write_keyring(path, ring)


def register() -> None:
    secret_app.command("rotate-key")(rotate_key)
