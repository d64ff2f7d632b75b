"""`levers9 boxes list|logs|stop`: the workspace's boxes (app.box), read through the gateway's
deployments and containers (GET /api/v1/deployments, /api/v1/containers). A box's log is its
container's: the program's stdout and stderr."""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.markup import escape

from levers9.cli_output import JSON_OPTION, client, console, errors, fail, show_rows

boxes_app = typer.Typer(help="Boxes (app.box): programs listening on a port, reached at /box/NAME/.",
                        no_args_is_help=True)


def box_rows(deployments: list[dict[str, Any]], gateway_url: str) -> list[dict[str, Any]]:
    """One row per box deployment (each version), with its command, port and URL (pure)."""
    rows = []
    for d in deployments:
        spec = d.get("spec") or {}
        box = spec.get("box")
        if (spec.get("code") or {}).get("kind") != "box" or not box:
            continue
        rows.append({"name": d["name"], "version": d.get("version"), "status": d.get("status"),
                     "command": " ".join(box.get("command", [])), "port": box.get("port"),
                     "ready_path": box.get("ready_path") or "", "containers": d.get("containers", 0),
                     "checkpoint_enabled": bool(spec.get("checkpoint_enabled")),
                     "deployment_id": d.get("deployment_id"), "url": f"{gateway_url}/box/{d['name']}/"})
    return rows


def newest_container(containers: list[dict[str, Any]], deployment_ids: set[str]) -> dict[str, Any] | None:
    """The newest container of these deployments (pure); None when they have none."""
    mine = [c for c in containers if c.get("deployment_id") in deployment_ids]
    return max(mine, key=lambda c: (str(c.get("created_at") or ""), str(c.get("updated_at") or "")), default=None)


def _boxes_named(name: str) -> tuple[Any, list[dict[str, Any]]]:
    c = client()
    rows = [r for r in box_rows(c.list_deployments(), c.gateway_url) if r["name"] == name]
    if not rows:
        fail(f"no box {name!r} in this workspace: see `levers9 boxes list`")
    return c, rows


@boxes_app.command("list")
def list_boxes(json_out: bool = JSON_OPTION) -> None:
    """Every box with its version, status, command, port, live containers and URL."""
    with errors():
        c = client()
        rows = box_rows(c.list_deployments(), c.gateway_url)
    show_rows(rows, ["name", "version", "status", "command", "port", "containers", "url"], json_out)


@boxes_app.command("logs")
def box_logs(name: str, follow: bool = typer.Option(False, "--follow", "-f", help="keep streaming until Ctrl-C")
             ) -> None:
    """The log (stdout and stderr) of the box's newest container, a stopped or failed one included."""
    try:
        with errors():
            c, rows = _boxes_named(name)
            newest = newest_container(c.list_containers(all=True), {r["deployment_id"] for r in rows})
            if newest is None:
                fail(f"box {name!r} has no container yet: call {rows[-1]['url']} to start one")
            assert newest is not None
            for chunk in c.container_logs(newest["container_id"], follow=follow):
                sys.stdout.write(chunk)
                sys.stdout.flush()
    except KeyboardInterrupt:
        pass


@boxes_app.command("stop")
def stop_box(name: str) -> None:
    """Stop the box (every version) and its containers; a later deploy starts it again."""
    with errors():
        c, _ = _boxes_named(name)
        answer = c.stop_deployment(name)
    console.print(f"stopped box {escape(name)} ({answer.get('containers_stopped', 0)} containers asked to stop)")


def register(app: typer.Typer) -> None:
    app.add_typer(boxes_app, name="boxes")
