"""`levers9 sandboxes list|exec|terminate`: the workspace's sandboxes (levers9.Sandbox), through the
gateway's /api/v1/sandboxes."""

from __future__ import annotations

import sys
from typing import Optional

import typer
from rich.markup import escape

from levers9.cli_output import JSON_OPTION, client, console, errors, fail, show_rows
from levers9.sandbox import Sandbox, SandboxError

sandboxes_app = typer.Typer(help="Sandboxes (levers9.Sandbox): containers driven from outside.", no_args_is_help=True)
COLUMNS = ["sandbox_id", "status", "app", "workdir", "created_at", "idle_timeout", "timeout", "from_snapshot"]


@sandboxes_app.command("list")
def list_sandboxes(json_out: bool = JSON_OPTION,
                   all: bool = typer.Option(False, "--all", help="terminated ones too")) -> None:
    """The workspace's sandboxes: id, status (starting, running, terminated, failed), app, workdir."""
    with errors():
        rows = Sandbox.list(client(), all=all)
    show_rows(rows, COLUMNS, json_out)


@sandboxes_app.command("exec")
def exec_in(sandbox_id: str, argv: list[str] = typer.Argument(..., help="the program and its arguments"),
            timeout: Optional[float] = typer.Option(None, "--timeout", help="kill it after this many seconds "
                                                    "(exit code 124)")) -> None:
    """Run a program in a sandbox, its output streamed here; exits with the program's exit code."""
    with errors():
        try:
            p = Sandbox.from_id(sandbox_id, client()).exec(*argv, timeout=timeout)
            for line in p.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
            sys.stderr.write(p.stderr.read())
            code = p.wait()
        except SandboxError as exc:
            fail(str(exc))
    raise typer.Exit(code)


@sandboxes_app.command("terminate")
def terminate(sandbox_id: str) -> None:
    """Stop a sandbox now (its container ends; nothing of it is kept unless it was snapshotted)."""
    with errors():
        try:
            Sandbox.from_id(sandbox_id, client()).terminate()
        except SandboxError as exc:
            fail(str(exc))
    console.print(f"terminated sandbox {escape(sandbox_id)}")


def register(app: typer.Typer) -> None:
    app.add_typer(sandboxes_app, name="sandboxes")
