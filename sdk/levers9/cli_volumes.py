"""CLI commands for volumes: `levers9 volumes create|list|ls|put|get|rm|delete`.

A volume is a directory of the platform's JuiceFS, per workspace; containers mount it with
`Volume(name, mount_path)`. Files go through the gateway's REST API (/api/v1/volumes/...), so the
CLI needs no file system client of its own.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import typer

from levers9.cli_output import JSON_OPTION, client, console, errors, print_json, show_rows

volumes_app = typer.Typer(help="Volumes: a workspace's persistent directories, mounted into containers.",
                          no_args_is_help=True)


def _call(method: str, path: str, what: str, **kwargs: Any) -> Any:
    return client()._call(method, path, what, "levers9 volumes list", **kwargs)


def _file_path(name: str, path: str) -> str:
    """The URL of a file; a path that leaves the volume is refused here too (an HTTP client would
    fold its `..` away and ask for another URL)."""
    from levers9.client import ClientError
    from levers9.contracts.volumes import InvalidPath, relative_path

    try:
        rel = relative_path(path)
    except InvalidPath as exc:
        raise ClientError(str(exc)) from None
    return f"/api/v1/volumes/{quote(name, safe='')}/files/{quote(rel, safe='/')}"


@volumes_app.command("create")
def create(name: str = typer.Argument(..., help="a-z, 0-9 and '-'")) -> None:
    """Create a volume in this workspace."""
    with errors():
        _call("POST", "/api/v1/volumes", f"creating volume {name!r}", json={"name": name})
    console.print(f"volume {name} created; mount it with Volume({name!r}, '/{name}')")


@volumes_app.command("list")
def list_volumes(json_out: bool = JSON_OPTION) -> None:
    """List this workspace's volumes."""
    with errors():
        rows = _call("GET", "/api/v1/volumes", "listing volumes")
    show_rows(rows, ["name", "created_at"], json_out)


@volumes_app.command("ls")
def ls(name: str, path: str = typer.Argument("", help="a directory or file in the volume"),
       json_out: bool = JSON_OPTION) -> None:
    """List the files of a volume (or of a directory in it)."""
    with errors():
        rows = _call("GET", f"/api/v1/volumes/{quote(name, safe='')}/ls", f"listing volume {name!r}",
                     params={"path": path})
    show_rows(rows, ["path", "type", "size", "mtime"], json_out)


@volumes_app.command("put")
def put(name: str, local: Path = typer.Argument(..., exists=True, dir_okay=False, help="the local file"),
        path: str = typer.Argument("", help="where in the volume (default: the file's name)")) -> None:
    """Upload a local file into a volume."""
    with errors(), local.open("rb") as f:
        doc = _call("PUT", _file_path(name, path or local.name), f"putting {local} into volume {name!r}", content=f,
                    headers={"Content-Type": "application/octet-stream"})
    console.print(f"{doc['size']} bytes -> {name}:{doc['path']}")


@volumes_app.command("get")
def get(name: str, path: str, local: str = typer.Argument("-", help="the local file, '-' for stdout")) -> None:
    """Download a file of a volume (to stdout by default)."""
    with errors():
        c, url = client(), _file_path(name, path)
        what = f"getting {path!r} from volume {name!r}"
        try:
            with c._http.stream("GET", url) as r:
                if r.status_code >= 400:
                    r.read()
                    raise c._status_error(r, what, "levers9 volumes ls " + name)
                out = sys.stdout.buffer if local == "-" else open(local, "wb")  # noqa: SIM115 - closed below
                try:
                    for chunk in r.iter_bytes(1 << 20):
                        out.write(chunk)
                finally:
                    out.flush() if local == "-" else out.close()
        except httpx.HTTPError as exc:
            raise c._transport_error(exc, what) from None


@volumes_app.command("rm")
def rm(name: str, path: str, recursive: bool = typer.Option(False, "--recursive", "-r")) -> None:
    """Remove a file (or with -r a directory) from a volume."""
    with errors():
        _call("DELETE", _file_path(name, path), f"removing {path!r} from volume {name!r}",
              params={"recursive": str(recursive).lower()})
    console.print(f"removed {name}:{path}")


@volumes_app.command("delete")
def delete(name: str, json_out: bool = JSON_OPTION) -> None:
    """Delete a volume and every file in it."""
    with errors():
        doc = _call("DELETE", f"/api/v1/volumes/{quote(name, safe='')}", f"deleting volume {name!r}")
    print_json(doc) if json_out else console.print(f"volume {name} deleted")


def register(app: typer.Typer) -> None:
    app.add_typer(volumes_app, name="volumes")
