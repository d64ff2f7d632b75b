"""What every `levers9` command shares: the consoles, `--json`, errors as one sentence, the client.

Its own module so that the command modules (cli_app.py, cli_images.py, ...) import it, never each
other: `levers9 deploy` (cli_app) builds images with cli_images, which needs only these helpers.
The SDK client is imported when a command runs, not when the CLI starts (`levers9 --help` stays fast).
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from levers9.app import ConfigError

if TYPE_CHECKING:
    from levers9.client import Client

console = Console(stderr=True, soft_wrap=True)
out = Console(width=None if sys.stdout.isatty() else 250, soft_wrap=True)

JSON_OPTION = typer.Option(False, "--json", help="print JSON")


def fail(message: str) -> None:
    console.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(1)


@contextmanager
def errors() -> Iterator[None]:
    """Turn the SDK's and the client's errors into "error: ..." and exit status 1."""
    from levers9.client import ClientError

    try:
        yield
    except (ClientError, ConfigError) as exc:
        fail(str(exc))


def client() -> "Client":
    from levers9.client import Client

    return Client.from_profile()


def print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stdout.flush()


def show_rows(rows: list[dict[str, Any]], columns: list[str], json_out: bool) -> None:
    """A table of the preferred columns present in the rows (all keys if none is), or JSON."""
    if json_out:
        return print_json(rows)
    present = [c for c in columns if any(c in r for r in rows)]
    if not present:
        present = list(dict.fromkeys(k for r in rows for k in r))
    table = Table(*present)
    for r in rows:
        table.add_row(*[escape(_cell(r.get(c))) for c in present])
    out.print(table)
    if not rows:
        console.print("none", style="dim")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)
