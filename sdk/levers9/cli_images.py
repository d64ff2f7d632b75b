"""CLI commands for images: `levers9 images build|list|logs|delete`, and the build step of
`levers9 deploy` (`ensure_images`): each distinct blueprint of the app is asked for once; a built one
is used at once; the others are followed live, a line per step ("[2/4] RUN pip install humanize ...
done 3.1 s") and the build's last log line, until they are built or one fails (its step, reason and
log tail are printed, and nothing is deployed).

`BuildView` folds a build's events into what is shown (pure, tested without a gateway).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import msgspec
import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from levers9.app import load_app_file
from levers9.cli_output import JSON_OPTION, client, console, errors, out, show_rows
from levers9.client import ClientError

if TYPE_CHECKING:
    from levers9.client import Client

images_app = typer.Typer(help="Images: build an app's images, list, read build logs, delete.", no_args_is_help=True)


class BuildFailed(ClientError):
    """A build ended with ImageBuildFailed; the message names the step and the reason."""


@dataclass
class BuildView:
    """One image's build as the events tell it."""
    image_id: str
    steps: list[dict[str, Any]] = field(default_factory=list)  # BuildStep JSON: index, kind, args, hash
    states: dict[int, tuple[str, float]] = field(default_factory=dict)
    builder: str = ""
    last_line: str = ""
    status: str = "requested"
    reason: str = ""
    failing_step: int = -1
    log_tail: list[str] = field(default_factory=list)
    size_bytes: int = 0
    seconds: float = 0.0

    def apply(self, env: dict[str, Any]) -> None:
        kind, data = env.get("type", ""), env.get("data") or {}
        if kind == "ImageBuildRequested":
            self.__init__(self.image_id)  # type: ignore[misc] # a new request starts the story over
        elif kind == "ImageBuildStarted":
            self.steps, self.builder, self.status = list(data.get("steps") or []), data.get("builder", ""), "building"
            cached = int(data.get("cached_steps") or 0)
            self.states = {s["index"]: ("cached" if s["index"] < cached else "waiting", 0.0) for s in self.steps}
        elif kind == "ImageBuildProgress":
            lines = [str(x) for x in data.get("lines") or []]
            if lines:
                self.last_line = lines[-1]
                self.log_tail = (self.log_tail + lines)[-40:]
            if data.get("state") and data["state"] != "log":
                self.states[int(data.get("step", 0))] = (data["state"], float(data.get("seconds") or 0.0))
        elif kind == "ImagePushed":
            self.status, self.last_line = "pushed", f"pushed {data.get('reference', '')}; archiving"
        elif kind == "ImageBuilt":
            self.status, self.size_bytes = "built", int(data.get("size_bytes") or 0)
            self.seconds = float(data.get("seconds") or 0.0)
        elif kind == "ImageBuildFailed":
            self.status, self.reason = "failed", str(data.get("reason", ""))
            self.failing_step = int(data.get("step", -1))
            self.log_tail = [str(x) for x in data.get("log_tail") or []] or self.log_tail
            if self.failing_step >= 0:
                self.states[self.failing_step] = ("failed", self.states.get(self.failing_step, ("", 0.0))[1])

    def step_text(self, step: dict[str, Any]) -> str:
        from levers9.contracts.images import BuildStep

        return msgspec.convert(step, BuildStep).text

    def lines(self) -> list[str]:
        """What the display shows: a line per step, then the last log line."""
        total = len(self.steps)
        out = []
        for s in self.steps:
            state, seconds = self.states.get(s["index"], ("waiting", 0.0))
            took = f" {seconds:.1f} s" if state in ("done", "failed") and seconds else ""
            out.append(f"[{s['index'] + 1}/{total}] {_short(self.step_text(s))} ... {state}{took}")
        if self.last_line and self.status not in ("built", "failed"):
            out.append(f"  {_short(self.last_line, 110)}")
        return out

    def failure(self) -> str:
        step = next((s for s in self.steps if s["index"] == self.failing_step), None)
        where = f" at step {self.failing_step + 1}/{len(self.steps)} ({_short(self.step_text(step))})" if step else ""
        return f"image {self.image_id} failed to build{where}: {self.reason}"


def _short(text: str, width: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def blueprint_id(blueprint: dict[str, Any]) -> str:
    from levers9.contracts.images import image_id
    from levers9.contracts.spec import ImageSpec

    return image_id(msgspec.convert(blueprint, ImageSpec))


def distinct_blueprints(specs: Iterable[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """image id -> (blueprint, the endpoints that use it): identical blueprints are built once."""
    found: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for spec in specs:
        if spec.get("image") is not None:
            image = blueprint_id(spec["image"])
            found.setdefault(image, (spec["image"], []))[1].append(spec["name"])
    return found


def follow_build(c: "Client", image_id: str) -> BuildView:
    """Show the build live until it ends; the final view."""
    view = BuildView(image_id)
    live = sys.stderr.isatty()
    shown: list[str] = []
    with Live(Group(), console=console, refresh_per_second=8, transient=False) if live else _NoLive() as display:
        for env in c.image_events(image_id, follow=True):
            view.apply(env)
            lines = view.lines()
            if live:
                display.update(Group(*[Text(line) for line in lines]))
            else:  # a pipe or a file: each step line once it changes, log lines as they come
                for line in lines:
                    if line not in shown:
                        console.print(escape(line))
                        shown.append(line)
    return view


class _NoLive:
    def __enter__(self) -> "_NoLive":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, renderable: object) -> None:
        return None


def ensure_images(c: "Client", specs: list[dict[str, Any]]) -> dict[str, str]:
    """Every image the specs name, built (or found built). -> endpoint name -> image id.
    BuildFailed when one fails (after printing its log tail)."""
    names: dict[str, str] = {}
    for image, (blueprint, endpoints) in distinct_blueprints(specs).items():
        answer = c.request_image(blueprint, requested_by=",".join(endpoints)[:200])
        if answer.get("status") == "built":
            console.print(f"using cached image {escape(image)}")
        else:
            console.print(f"building image {escape(image)} for {escape(', '.join(endpoints))}")
            view = follow_build(c, image)
            if view.status != "built":
                for line in view.log_tail[-20:]:
                    console.print(f"  | {escape(line)}", style="dim")
                raise BuildFailed(view.failure() + f": see `levers9 images logs {image}`")
            console.print(f"built image {escape(image)} ({view.size_bytes / 2**20:.1f} MiB) in {view.seconds:.1f} s")
        names.update({e: image for e in endpoints})
    return names


# ---- commands ------------------------------------------------------------------------------------

@images_app.command("build")
def images_build(file: Path = typer.Argument(..., help="the .py file that defines the App")) -> None:
    """Build every image FILE's endpoints name (each distinct blueprint once)."""
    with errors():
        specs = load_app_file(file)
        built = ensure_images(client(), specs)
    if not built:
        console.print(f"{escape(str(file))} names no image: pass image=Image(...) to an endpoint", style="dim")


@images_app.command("list")
def images_list(json_out: bool = JSON_OPTION) -> None:
    """List images with their status and size."""
    with errors():
        rows = client().list_images()
    show_rows(rows, ["image_id", "status", "size_bytes", "steps", "built_at", "requested_by", "reference", "reason"],
              json_out)


@images_app.command("logs")
def images_logs(image_id: str = typer.Argument(..., metavar="ID"),
                follow: bool = typer.Option(False, "--follow", "-f", help="until the build ends")) -> None:
    """Print an image's build log: each step's state and the build's own lines."""
    view = BuildView(image_id)
    try:
        with errors():
            for env in client().image_events(image_id, follow=follow):
                for line in log_lines(view, env):
                    out.print(escape(line))
    except KeyboardInterrupt:
        pass


def log_lines(view: BuildView, env: dict[str, Any]) -> list[str]:
    """The log lines one event adds: a step's new state, the build's output, how it ended."""
    before = view.lines()[: len(view.steps)]
    view.apply(env)
    kind, data = env.get("type", ""), env.get("data") or {}
    if kind == "ImageBuildRequested":
        return [f"requested by {data.get('requested_by') or '?'}"]
    if kind == "ImageBuildProgress" and data.get("state") == "log":
        return [str(x) for x in data.get("lines") or []]
    if kind == "ImageBuilt":
        return [f"built {view.image_id}: {view.size_bytes / 2**20:.1f} MiB in {view.seconds:.1f} s"]
    if kind == "ImageBuildFailed":
        return [*view.log_tail[-20:], view.failure()]
    if kind == "ImageBuildStarted":
        return [f"started on {view.builder}", *view.lines()[: len(view.steps)]]
    return [line for line in view.lines()[: len(view.steps)] if line not in before]


@images_app.command("delete")
def images_delete(image_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Delete an image (refused while a deployment uses it)."""
    with errors():
        client().delete_image(image_id)
    console.print(f"deleted image {escape(image_id)}")


def register(app: typer.Typer) -> None:
    app.add_typer(images_app, name="images")
