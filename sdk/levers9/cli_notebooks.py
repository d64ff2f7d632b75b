"""`levers9 notebook NAME [--image FILE:VAR] [--gpu T] [--idle-timeout S] [--json]`: deploy a notebook
(app.notebook, levers9.notebooks) without writing a file, and print where to open it: the dashboard's
/nb/NAME/ (sign in with `levers9 dashboard`). Running it again deploys a new version, which starts
afresh: a version's checkpoints are its own.

Its app is "notebooks"; `levers9 boxes list|logs|stop` see it as the box it is.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from levers9.cli_images import distinct_blueprints, ensure_images
from levers9.cli_output import client, errors, fail, out, print_json

APP_NAME = "notebooks"


def image_from(ref: str) -> Any:
    """The Image a `FILE:VAR` names (the file is imported, as `levers9 deploy` imports an app file)."""
    from levers9.app import _app_file, _import_file
    from levers9.options import Image

    file, sep, var = ref.rpartition(":")
    if not sep or not file or not var.isidentifier():
        fail(f"--image {ref!r} is not valid: FILE:VAR, the .py file and the name of an Image in it, "
             "e.g. --image images.py:data_science")
    module = _import_file(_app_file(file))
    image = getattr(module, var, None)
    if not isinstance(image, Image):
        fail(f"{file} has no Image named {var!r} (found {type(image).__name__}): define "
             f"`{var} = Image(python_packages=[...])` in it")
    return image


def notebook_spec(name: str, image: Any, gpu: Optional[str], idle_timeout: int, cpu: Optional[float],
                  memory: Optional[str]) -> dict[str, Any]:
    """The notebook's deployment spec, as app.notebook makes it (ConfigError on a mistake)."""
    from levers9.app import App

    options: dict[str, Any] = {k: v for k, v in {"gpu": gpu, "cpu": cpu, "memory": memory}.items() if v is not None}
    app = App(APP_NAME)
    app.notebook(name, image=image, idle_timeout=idle_timeout, **options)
    return app.specs()[0]


def dashboard_base() -> str:
    from levers9.cli_dashboard import dashboard_url
    from levers9.runtime.config import Settings

    state = Settings.load().home_path / "state.json"
    return dashboard_url(json.loads(state.read_text())) if state.exists() else ""


def register(app: typer.Typer) -> None:
    @app.command("notebook")
    def notebook(name: str = typer.Argument(..., help="the notebook's name (lowercase, digits, '-')"),
                 image: Optional[str] = typer.Option(None, "--image", help="FILE:VAR, an Image in a .py file "
                                                                           "(jupyterlab is added to it)"),
                 gpu: Optional[str] = typer.Option(None, "--gpu", help="a GPU type, e.g. T4"),
                 cpu: Optional[float] = typer.Option(None, "--cpu", help="cores"),
                 memory: Optional[str] = typer.Option(None, "--memory", help="e.g. 2Gi (default 1Gi)"),
                 idle_timeout: int = typer.Option(600, "--idle-timeout", help="seconds idle before it is dumped "
                                                                               "and stopped"),
                 json_out: bool = typer.Option(False, "--json", help="print the deployment as JSON")) -> None:
        """Deploy a JupyterLab notebook, opened through the dashboard at /nb/NAME/; idle, it is dumped
        and stopped, and opening it again restores it with its kernels' variables."""
        from levers9.client import package_code

        with errors():
            spec = notebook_spec(name, image_from(image) if image else None, gpu, idle_timeout, cpu, memory)
            c = client()
            if distinct_blueprints([spec]):
                ensure_images(c, [spec])
            with tempfile.TemporaryDirectory() as empty:  # a notebook has no code of its own
                answer = c.deploy(spec, package_code(Path(empty)))
        base = dashboard_base().rstrip("/")
        url = f"{base}/nb/{name}/" if base else f"/nb/{name}/ on the dashboard"
        if json_out:
            print_json({**answer, "name": name, "url": url, "idle_timeout": idle_timeout})
            return
        out.print(f"notebook [bold]{escape(name)}[/bold] version {escape(str(answer.get('version', '?')))}: "
                  f"{escape(url)} (sign in first with `levers9 dashboard --open`)")
