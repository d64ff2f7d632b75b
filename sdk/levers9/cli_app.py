"""CLI commands for apps: `levers9 deploy`, `serve`, and the deployments, containers, workers, token
and secret groups. `register(app)` adds them to the `levers9` Typer app (see cli.py).

Errors print "error: <sentence>" and exit 1, never a traceback.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import typer
from rich.markup import escape

from levers9.app import ConfigError, load_app_file
from levers9.cli_images import distinct_blueprints, ensure_images
from levers9.cli_output import JSON_OPTION, client, console, errors, out, print_json, show_rows

if TYPE_CHECKING:
    from levers9.client import Client

# ---- deploy and serve ----------------------------------------------------------------------------

def deploy_file(get_client: Callable[[], "Client"], file: Path, progress: Callable[[str], None],
                pause: Callable[[], Any] = nullcontext) -> list[dict[str, Any]]:
    """Load the file's endpoints, build the images they name (each blueprint once; nothing is
    deployed when one fails), package its directory, and POST each spec. -> the gateway's answers.
    `pause`: a context during which the caller's own live display is stopped (the builds show theirs)."""
    from levers9.client import code_files, package_code

    progress(f"loading {file}")
    specs = load_app_file(file)
    c = get_client()
    if distinct_blueprints(specs):
        with pause():
            ensure_images(c, specs)
    directory = file.resolve().parent
    count = len(code_files(directory))
    progress(f"packaging {directory} ({count} .py files)")
    code = package_code(directory)
    results = []
    for spec in specs:
        progress(f"deploying {spec['name']} ({len(code) / 1024:.1f} KiB of code)")
        answer = c.deploy(spec, code)
        name = answer.get("name") or spec["name"]
        results.append({**answer, "name": name, "invocation_url": c.invocation_url(name, spec["code"]["kind"]),
                        "kind": spec["code"]["kind"], "app_name": spec.get("app_name", "")})
    return results


def _report(results: list[dict[str, Any]]) -> None:
    for r in results:
        how = (f"Function.lookup({r.get('app_name', '')!r}, {r['name']!r})" if r.get("kind") == "function"
               else r["invocation_url"])
        out.print(f"deployed [bold]{escape(str(r['name']))}[/bold] version {escape(str(r.get('version', '?')))}: "
                  f"{escape(how)}")


def deploy(file: Path = typer.Argument(..., help="the .py file that defines the App"),
           json_out: bool = JSON_OPTION) -> None:
    """Deploy every endpoint of FILE; prints each one's name, version and URL."""
    with errors(), console.status("deploying") as spinner:
        def progress(msg: str) -> None:
            spinner.update(msg)
            console.print(f"  {escape(msg)}")

        @contextmanager
        def pause() -> Iterator[None]:
            spinner.stop()
            try:
                yield
            finally:
                spinner.start()

        results = deploy_file(client, file, progress, pause)
    print_json(results) if json_out else _report(results)


def serve(file: Path = typer.Argument(..., help="the .py file that defines the App"),
          interval: float = typer.Option(1.0, help="seconds between checks for changed files")) -> None:
    """Deploy FILE and redeploy it on every change, streaming its logs, until Ctrl-C.

    Checks the mtimes of the .py files in FILE's directory every --interval seconds; follows the log
    of the newest container of each deployment."""
    from levers9.client import ClientError, code_files

    with errors():
        results = deploy_file(client, file, lambda msg: console.print(f"  {escape(msg)}"))
        c = client()
    _report(results)
    directory = file.resolve().parent
    follower = LogFollower(c)
    snapshot = _mtimes(code_files(directory))
    console.print(f"watching {escape(str(directory))} for changes; Ctrl-C to stop", style="dim")
    try:
        last_poll = 0.0
        while True:
            time.sleep(interval)
            now = _mtimes(code_files(directory))
            if now != snapshot:
                changed = sorted({p.name for p in set(now) ^ set(snapshot)} |
                                 {p.name for p in now if p in snapshot and now[p] != snapshot[p]})
                snapshot = now
                console.print(f"changed: {escape(', '.join(changed))}; redeploying")
                try:
                    results = deploy_file(lambda: c, file, lambda msg: console.print(f"  {escape(msg)}"))
                    _report(results)
                except (ConfigError, ClientError, OSError) as exc:  # keep watching for the fix
                    console.print(f"[red]error:[/red] {escape(str(exc))}")
            if time.monotonic() - last_poll >= 2 * interval:
                last_poll = time.monotonic()
                follower.update(results)
    except KeyboardInterrupt:
        names = ", ".join(str(r["name"]) for r in results)
        console.print(f"stopped watching; {escape(names)} keeps running (`levers9 deployments stop NAME`)")


def _mtimes(files: list[Path]) -> dict[Path, tuple[int, int]]:
    stamps = {}
    for p in files:
        try:
            st = p.stat()
            stamps[p] = (st.st_mtime_ns, st.st_size)
        except OSError:
            pass
    return stamps


class LogFollower:
    """Streams the log of the newest container of each deployment, each in a thread of its own."""

    def __init__(self, c: "Client"):
        self.client = c
        self.following: dict[str, str] = {}  # deployment name -> container id
        self.streams: dict[str, threading.Thread] = {}  # container id -> the thread streaming its log
        self.warned = False

    def update(self, results: list[dict[str, Any]]) -> None:
        from levers9.client import ClientError

        try:
            containers = self.client.list_containers()
        except ClientError as exc:
            console.print(f"[yellow]warning:[/yellow] {escape(str(exc))}")
            return
        for r in results:
            mine = [x for x in containers if x.get("deployment_id") == r.get("deployment_id")
                    or (x.get("deployment_name") or x.get("name")) == r["name"]]
            if not mine:
                if not self.warned:
                    console.print(f"no container yet: call {escape(r['invocation_url'])} to start one", style="dim")
                    self.warned = True
                continue
            newest = max(mine, key=lambda x: str(x.get("created_at") or x.get("updated_at") or ""))
            cid = str(newest.get("container_id", ""))
            if cid and self.following.get(r["name"]) != cid:
                self.following[r["name"]] = cid
                prefix = f"{r['name']} | " if len(results) > 1 else ""
                self.streams = {k: t for k, t in self.streams.items() if t.is_alive()}
                self.streams[cid] = threading.Thread(target=self._stream, args=(cid, prefix), daemon=True)
                self.streams[cid].start()

    def _stream(self, container_id: str, prefix: str) -> None:
        from levers9.client import Client, ClientError

        console.print(f"logs of container {escape(container_id)}:", style="dim")
        c = Client(self.client.gateway_url, self.client.token)  # a connection of its own
        partial = ""
        try:
            for chunk in c.container_logs(container_id, follow=True):
                lines = (partial + chunk).split("\n")
                partial = lines.pop()
                for line in lines:
                    sys.stdout.write(f"{prefix}{line}\n")
                sys.stdout.flush()
        except ClientError as exc:
            console.print(f"[yellow]warning:[/yellow] {escape(str(exc))}")
        finally:
            if partial:
                sys.stdout.write(f"{prefix}{partial}\n")
            c.close()


# ---- resource groups -----------------------------------------------------------------------------

deployments_app = typer.Typer(help="Deployments: list, scale, stop, delete.", no_args_is_help=True)
containers_app = typer.Typer(help="Containers: list, stop, read logs.", no_args_is_help=True)
workers_app = typer.Typer(help="Workers: list, cordon, drain.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=True)
secret_app = typer.Typer(help="Secrets given to containers as environment variables.", no_args_is_help=True)
checkpoints_app = typer.Typer(help="Checkpoints: list, delete.", no_args_is_help=True)


@deployments_app.command("list")
def deployments_list(json_out: bool = JSON_OPTION,
                     sandboxes: bool = typer.Option(False, "--sandboxes", help="Also the deployments made for "
                                                    "sandboxes (sb-…, one per set of options).")) -> None:
    """List deployments."""
    with errors():
        rows = client().list_deployments(sandboxes=sandboxes)
    show_rows(rows if json_out else [deployment_columns(r) for r in rows],
              ["name", "version", "status", "containers", "desired", "cpu_millicores", "memory_mib", "gpu", "gpu_count",
               "deployment_id", "created_at"], json_out)


def deployment_columns(row: dict[str, Any]) -> dict[str, Any]:
    """A deployment as the table shows it: what its spec asks for (spec.resources) in columns of its own."""
    resources = (row.get("spec") or {}).get("resources") or {}
    shown = {k: resources[k] for k in ("cpu_millicores", "memory_mib", "gpu_count") if k in resources}
    if resources.get("gpu"):
        shown["gpu"] = ",".join(resources["gpu"])  # types in order of preference
    return {**{k: v for k, v in row.items() if k != "spec"}, **shown}


@deployments_app.command("scale")
def deployments_scale(name: str = typer.Argument(..., help="the deployment's name"),
                      min_: int | None = typer.Option(None, "--min", help="min_containers"),
                      max_: int | None = typer.Option(None, "--max", help="max_containers"),
                      buffer: int | None = typer.Option(None, "--buffer", help="buffer_containers"),
                      target: int | None = typer.Option(None, "--target-concurrency",
                                                           help="calls per container the autoscaler aims for"),
                      json_out: bool = JSON_OPTION) -> None:
    """Change a live deployment's scaling; the autoscaler applies it within a second."""
    with errors():
        done = client().scale_deployment(name, min=min_, max=max_, buffer=buffer, target_concurrency=target)
    if json_out:
        print_json(done)
        return
    sc = done.get("scaling", {})
    console.print(f"scaled {escape(name)}: min {sc.get('min_containers')}, max {sc.get('max_containers')}, "
                  f"buffer {sc.get('buffer_containers')}, target_concurrency {sc.get('target_concurrency') or 'concurrency'}")


@deployments_app.command("stop")
def deployments_stop(name: str = typer.Argument(..., help="the deployment's name")) -> None:
    """Stop a deployment: its containers stop; calls are refused until it is deployed again."""
    with errors():
        client().stop_deployment(name)
    console.print(f"stopped deployment {escape(name)}")


@deployments_app.command("delete")
def deployments_delete(name: str = typer.Argument(..., help="the deployment's name")) -> None:
    """Delete a deployment and all its versions."""
    with errors():
        client().delete_deployment(name)
    console.print(f"deleted deployment {escape(name)}")


@containers_app.command("list")
def containers_list(json_out: bool = JSON_OPTION,
                    all_: bool = typer.Option(False, "--all", "-a", help="include stopped and failed ones")) -> None:
    """List containers (live ones; --all for stopped and failed too, with why)."""
    with errors():
        rows = client().list_containers(all=all_)
    show_rows(rows, ["container_id", "deployment_id", "status", "worker_id", "address", "note", "reason",
                     "updated_at"], json_out)


@containers_app.command("checkpoint")
def containers_checkpoint(container_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Dump a ready container now (leave-running); the checkpoint appears in `levers9 checkpoints list`."""
    with errors():
        client().checkpoint_container(container_id)
    console.print(f"checkpoint requested for container {escape(container_id)}")


@checkpoints_app.command("list")
def checkpoints_list(json_out: bool = JSON_OPTION,
                     all_: bool = typer.Option(False, "--all", "-a", help="include deleted ones")) -> None:
    """List checkpoints with their status (dumped, available, checkpoint_failed, restore_failed)."""
    with errors():
        rows = client().list_checkpoints(all=all_)
    show_rows(rows, ["checkpoint_id", "deployment_id", "status", "size_bytes", "worker_id", "restores",
                     "last_restored_at", "reason"], json_out)


@checkpoints_app.command("delete")
def checkpoints_delete(checkpoint_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Delete a checkpoint (its S3 object too); the next cold start takes a new one."""
    with errors():
        client().delete_checkpoint(checkpoint_id)
    console.print(f"deleted checkpoint {escape(checkpoint_id)}")


@containers_app.command("stop")
def containers_stop(container_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Stop a container."""
    with errors():
        client().stop_container(container_id)
    console.print(f"stop requested for container {escape(container_id)}")


@containers_app.command("logs")
def containers_logs(container_id: str = typer.Argument(..., metavar="ID"),
                    follow: bool = typer.Option(False, "--follow", "-f", help="keep streaming until Ctrl-C")) -> None:
    """Print a container's log."""
    try:
        with errors():
            for chunk in client().container_logs(container_id, follow=follow):
                sys.stdout.write(chunk)
                sys.stdout.flush()
    except KeyboardInterrupt:
        pass


@workers_app.command("list")
def workers_list(json_out: bool = JSON_OPTION) -> None:
    """List workers; gpu_source says whether NVML detected the GPUs or the pool configured them."""
    with errors():
        rows = client().list_workers()
    show_rows(rows, ["worker_id", "pool", "cluster", "status", "cordoned", "cpu_millicores", "memory_mib", "gpu_type",
                     "gpu_count", "gpu_source", "address", "updated_at"], json_out)


@workers_app.command("cordon")
def workers_cordon(worker_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Place nothing new on a worker; what runs there keeps running."""
    with errors():
        client().cordon_worker(worker_id)
    console.print(f"cordoned worker {escape(worker_id)}")


@workers_app.command("drain")
def workers_drain(worker_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Cordon a worker and move its containers elsewhere."""
    with errors():
        client().drain_worker(worker_id)
    console.print(f"draining worker {escape(worker_id)}")


@token_app.command("create")
def token_create(name: str = typer.Option("cli", help="a name to recognise the token by")) -> None:
    """Create an API token; it is printed this once."""
    with errors():
        doc = client().create_token(name)
    out.print(escape(str(doc.get("token", ""))))
    console.print(f"token {escape(str(doc.get('token_id', '')))} created; it will not be shown again", style="dim")


@token_app.command("list")
def token_list(json_out: bool = JSON_OPTION) -> None:
    """List API tokens (never their values)."""
    with errors():
        rows = client().list_tokens()
    show_rows(rows, ["token_id", "name", "created_at", "last_used_at"], json_out)


@token_app.command("revoke")
def token_revoke(token_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Revoke an API token."""
    with errors():
        client().revoke_token(token_id)
    console.print(f"revoked token {escape(token_id)}")


@secret_app.command("create")
def secret_create(name: str = typer.Argument(..., help="the variable's name in the container"),
                  value: str = typer.Argument(..., help="the value; '-' reads it from stdin")) -> None:
    """Store a secret (or replace its value)."""
    from levers9.app import Secret

    if value == "-":
        value = sys.stdin.read().rstrip("\n")
    with errors():
        Secret(name)  # the same name rule the SDK applies
        client().create_secret(name, value)
    console.print(f"stored secret {escape(name)}")


@secret_app.command("list")
def secret_list(json_out: bool = JSON_OPTION) -> None:
    """List secrets (names only)."""
    with errors():
        rows = client().list_secrets()
    show_rows(rows, ["name", "updated_at"], json_out)


@secret_app.command("delete")
def secret_delete(name: str = typer.Argument(...)) -> None:
    """Delete a secret."""
    with errors():
        client().delete_secret(name)
    console.print(f"deleted secret {escape(name)}")


def register(app: typer.Typer) -> None:
    """Add the app commands to the `levers9` command."""
    app.command()(deploy)
    app.command()(serve)
    app.add_typer(deployments_app, name="deployments")
    app.add_typer(containers_app, name="containers")
    app.add_typer(workers_app, name="workers")
    app.add_typer(token_app, name="token")
    app.add_typer(secret_app, name="secret")
    app.add_typer(checkpoints_app, name="checkpoints")
