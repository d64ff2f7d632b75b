"""`levers9 contracts flow`: for each event type, the services that append it and those that
consume it, read from the installed services' source (levers9.contracts_flow)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from levers9.cli_output import JSON_OPTION, console, fail, out, print_json


def flow(aggregate: Optional[list[str]] = typer.Option(None, "--aggregate", "-a",
                                                      help="only events of this aggregate (repeatable)"),
         json_out: bool = JSON_OPTION) -> None:
    """Who appends and who consumes each event type, derived from the services' code."""
    from levers9.contracts.events import EVENT_TYPES
    from levers9.contracts_flow import analyse, installed_sources

    aggregates = {name: cls.AGGREGATE for name, cls in EVENT_TYPES.items()}
    unknown_aggregates = sorted(set(aggregate or ()) - set(aggregates.values()))
    if unknown_aggregates:
        fail(f"unknown aggregate {', '.join(unknown_aggregates)}; known: {', '.join(sorted(set(aggregates.values())))}")
    rows = analyse(installed_sources(), set(EVENT_TYPES)).rows(aggregates)
    rows = [r for r in rows if not aggregate or r["aggregate"] in aggregate]
    if json_out:
        return print_json(rows)
    table = Table("event", "aggregate", "appended by", "consumed by")
    for r in rows:
        appenders = ", ".join(r["appended_by"]) or ("external" if r["external"] else "[red]nobody[/red]")
        table.add_row(escape(str(r["type"])), escape(str(r["aggregate"])), appenders,
                      escape(", ".join(r["consumed_by"])) or "[dim]nobody (audit only)[/dim]")
    out.print(table)
    for r in rows:
        if r["external"]:
            console.print(f"{r['type']}: {r['external']}", style="dim")


def register(contracts_app: typer.Typer) -> None:
    contracts_app.command("flow")(flow)
