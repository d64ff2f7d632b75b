"""`levers9 dashboard [--open] [--json] [--url URL]`: a one-time sign-in link to the dashboard.

The dashboard's address is this home's (`levers9 up` records it: `levers9 status --json`, component
`dashboard`), or --url for one elsewhere (compose, Kubernetes). The link is made by the dashboard
itself from the profile's token (`POST /api/session/tickets`): it works once, for two minutes, and
signs the browser in to the profile's workspace. The token never appears in the link.
"""

from __future__ import annotations

import json
from typing import Optional

import typer

from levers9.cli_output import console, fail, print_json


def dashboard_url(home_state: dict) -> str:
    return str(home_state.get("components", {}).get("dashboard", {}).get("url", ""))


def register(app: typer.Typer) -> None:
    @app.command("dashboard")
    def dashboard(open_browser: bool = typer.Option(False, "--open", help="open the link in a browser"),
                  json_out: bool = typer.Option(False, "--json", help="print {url, expires_at, workspace}"),
                  url: Optional[str] = typer.Option(None, "--url", help="the dashboard's address (default: "
                                                                        "the one `levers9 up` started)")) -> None:
        """Print a one-time sign-in link to the dashboard (valid 2 minutes) for the profile's workspace."""
        import httpx

        from levers9.runtime.config import Settings

        s = Settings.load()
        state_file = s.home_path / "state.json"
        base = url or (dashboard_url(json.loads(state_file.read_text())) if state_file.exists() else "")
        if not base:
            fail("no dashboard is known: run `levers9 up` (it starts one), or pass --url")
        if not s.client.token:
            fail("the profile has no token: run `levers9 up`, or set LEVERS9_TOKEN")
        try:
            r = httpx.post(f"{base.rstrip('/')}/api/session/tickets", timeout=10, trust_env=False,
                           headers={"Authorization": f"Bearer {s.client.token}"})
        except httpx.HTTPError as exc:
            fail(f"the dashboard at {base} does not answer ({type(exc).__name__}); `levers9 status` says why")
        if r.status_code != 201:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            fail(f"the dashboard at {base} refused a sign-in link ({r.status_code}): {detail}")
        doc = r.json()
        if json_out:
            print_json(doc)
        else:
            typer.echo(doc["url"])
            console.print(f"a one-time sign-in link for workspace {doc.get('workspace', '?')}, "
                          f"valid until {doc['expires_at']}", style="dim")
        if open_browser:
            import webbrowser

            if not webbrowser.open(doc["url"]):
                console.print("no browser could be opened here: open the link yourself", style="yellow")
