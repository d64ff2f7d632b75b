"""`levers9 publishers create|list|revoke`: NATS credentials for another system that publishes into
one workspace. The server itself refuses what they may not do (levers9.runtime.nats_auth): any
subject outside `levers9.<workspace>.`, and every event type but the requests meant for outside
systems. Run it on the host of the home whose `levers9 up` started NATS (it holds the keys).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import typer

from levers9.cli_output import console, fail, out
from levers9.runtime.config import Settings
from levers9.runtime.nats_auth import inbox_prefix, publisher_tag

publishers_app = typer.Typer(help="NATS credentials for systems that publish into one workspace.",
                             no_args_is_help=True)


def _issuer(s: Settings):  # -> levers9.runtime.nats_issuer.Issuer
    from levers9.runtime.nats_issuer import Issuer

    issuer = Issuer(s.bus.issuer or s.home_path / "nats" / "auth")
    if not issuer.ready:
        fail(f"no NATS credentials in {issuer.dir}: run `levers9 up` (it starts NATS with authentication) "
             "on this machine first, with the same LEVERS9_HOME")
    return issuer


@publishers_app.command("create")
def create(workspace: str = typer.Option(..., "--workspace", "-w", help="the workspace it may publish into"),
           out_file: Path = typer.Option(None, "--out", help="write the .creds file here (0600) instead of stdout"),
           json_out: bool = typer.Option(False, "--json", help="print id, workspace and creds as JSON")) -> None:
    """New credentials that may publish only into WORKSPACE; the creds are shown once."""
    from levers9.contracts.ids import InvalidName, check_workspace

    try:
        check_workspace(workspace)
    except InvalidName as exc:
        fail(str(exc))
    pub, creds = _issuer(Settings.load()).create_publisher(workspace)
    if out_file is not None:
        fd = os.open(out_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(creds)
    inbox = inbox_prefix(publisher_tag(workspace, pub.id))
    if json_out:
        out.print_json(json.dumps({"id": pub.id, "workspace": workspace, "user_key": pub.user_key,
                                   "inbox_prefix": inbox, "creds": None if out_file else creds,
                                   "creds_file": str(out_file or "")}))
    elif out_file is None:
        print(creds, end="")
    console.print(f"publisher {pub.id} of workspace {workspace!r}" + (f": {out_file}" if out_file else "")
                  + f"; connect with inbox prefix {inbox} (the only inbox it may read replies on)")


@publishers_app.command("list")
def list_(json_out: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Publishers issued on this home, revoked ones included."""
    from dataclasses import asdict

    pubs = _issuer(Settings.load()).publishers()
    if json_out:
        out.print_json(json.dumps([asdict(p) for p in pubs]))
        return
    for p in pubs:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(p.created_at))
        out.print(f"{p.id}  {p.workspace}  created {when}" + ("  REVOKED" if p.revoked_at else ""))


@publishers_app.command("revoke")
def revoke(publisher_id: str = typer.Argument(..., help="the id `publishers list` shows")) -> None:
    """Revoke a publisher: the server refuses its credentials from now on (config reload)."""
    from levers9.stack import nats_server
    from levers9.stack.home import Home

    s = Settings.load()
    try:
        pub = _issuer(s).revoke_publisher(publisher_id)
    except KeyError as exc:
        fail(str(exc.args[0]))
    entry = Home(s.home_path).read_state()["components"].get("nats") or {}
    if entry.get("auth") and entry.get("pid"):
        nats_server.reload(s.home_path, entry["pid"], s)
        console.print(f"publisher {pub.id} revoked; NATS (pid {entry['pid']}) reloaded its accounts")
    else:
        console.print(f"publisher {pub.id} revoked; NATS is not running here: the next `levers9 up` applies it")
