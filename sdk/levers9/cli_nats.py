"""`levers9 nats init DIR`: the NATS keys and credentials for a deployment `levers9 up` does not start
(docker compose, Kubernetes): the operator and account JWTs in `server.conf` (nats-server -c), one
user per service (`<service>.creds`) and its event signing key (`<service>.sign`), `signers.json`
for every consumer, and a user for each static worker named with --worker. Idempotent: keys that
exist are kept, so it can run at every start (compose's `nats-auth` service does)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from levers9.cli_output import console, out

nats_app = typer.Typer(help="NATS authentication for a deployment of your own (compose, Kubernetes).",
                       no_args_is_help=True)


@nats_app.command("init")
def init(directory: Path = typer.Argument(..., help="where the keys go (keep it private: it holds the seeds)"),
         worker: list[str] = typer.Option([], "--worker", help="a static worker's id: mint its own user"),
         json_out: bool = typer.Option(False, "--json", help="print the files written as JSON")) -> None:
    """Write (or keep) the operator, account, service and worker keys and nats-server's auth config."""
    from levers9.runtime import nats_auth
    from levers9.runtime.nats_issuer import Issuer

    issuer = Issuer(directory)
    issuer.ensure()
    files = {"server_config": str(issuer.write_server_config()), "signers": str(issuer.signers_path),
             "services": {role: {"creds": str(issuer.creds_path(role)), "sign": str(issuer.signing_path(role))}
                          for role in nats_auth.ROLES_SERVICES},
             "workers": {wid: {"creds": str(issuer.worker_creds(wid)),
                               "sign": str(issuer.signing_path(nats_auth.WORKER))} for wid in worker}}
    if json_out:
        out.print_json(json.dumps(files))
        return
    console.print(f"NATS auth in {directory}: nats-server -c {files['server_config']}; "
                  f"{len(files['services'])} service users, {len(worker)} worker user(s)")
