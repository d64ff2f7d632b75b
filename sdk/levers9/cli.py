"""The `levers9` command line: run the stack, look at it, audit and replay its log."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import sys
import time
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit, urlunsplit

import typer
from rich.console import Console
from rich.table import Table

from levers9.cli_app import register as _register_app_commands
from levers9.cli_boxes import register as _register_box_commands
from levers9.cli_catalogue import catalogue_app
from levers9.cli_clusters import register as _register_cluster_commands
from levers9.cli_contracts import register as _register_contract_commands
from levers9.cli_dashboard import register as _register_dashboard_command
from levers9.cli_functions import register as _register_function_commands
from levers9.cli_images import register as _register_image_commands
from levers9.cli_nats import nats_app
from levers9.cli_notebooks import register as _register_notebook_commands
from levers9.cli_publishers import publishers_app
from levers9.cli_sandboxes import register as _register_sandbox_commands
from levers9.cli_secrets import register as _register_secret_commands
from levers9.cli_tasks import register as _register_task_commands
from levers9.cli_volumes import register as _register_volume_commands
from levers9.runtime.config import SERVICES, SettingError, Settings, unknown_warning, write_profile

app = typer.Typer(help="levers9: run code in containers; restore checkpoints instead of booting cold.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
events_app = typer.Typer(help="Audit and replay the event log.", no_args_is_help=True)
contracts_app = typer.Typer(help="Event contracts for other systems.", no_args_is_help=True)
projections_app = typer.Typer(help="Read models kept by the services.", no_args_is_help=True)
app.add_typer(events_app, name="events")
app.add_typer(catalogue_app, name="catalogue")
app.add_typer(contracts_app, name="contracts")
app.add_typer(projections_app, name="projections")
app.add_typer(publishers_app, name="publishers")
app.add_typer(nats_app, name="nats")
_register_app_commands(app)
_register_function_commands(app)
_register_image_commands(app)
_register_contract_commands(contracts_app)
_register_secret_commands()
_register_volume_commands(app)
_register_cluster_commands(app)
_register_dashboard_command(app)
_register_task_commands(app)
_register_box_commands(app)
_register_sandbox_commands(app)
_register_notebook_commands(app)

console = Console(stderr=True, soft_wrap=True)
out = Console(width=None if sys.stdout.isatty() else 250)  # pipes and files get whole lines


def fail(message: str, code: int = 1) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def settings() -> Settings:
    return Settings.load()


def bus_auth():  # -> levers9.runtime.bus_auth.BusAuth: this home's admin when its NATS runs with auth
    from levers9.runtime.bus_auth import BusAuth

    return BusAuth.from_settings(settings())


def server_urls(s: Settings) -> dict[str, str]:
    """Server URLs: LEVERS9_* when given, else what `levers9 up` recorded in state.json."""
    state_file = s.home_path / "state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    urls = {k: s.get(k) or state.get(k, "") for k in ("nats_url", "database_url", "s3_endpoint")}
    return urls


def need(url: str, what: str) -> str:
    if not url:
        fail(f"no {what} known: run `levers9 up` first, or set LEVERS9_{what.upper()}")
    return url


# ---- services and the stack -------------------------------------------------------------------

@app.command()
def service(name: str = typer.Argument(..., help=f"one of: {', '.join(SERVICES)}")) -> None:
    """Run one service process in the foreground (what `levers9 up` starts six of, and the dashboard)."""
    from levers9.services import service_class

    cls = service_class(name)
    s = settings()
    asyncio.run(cls(s.with_(service=name)).run())


@app.command()
def up(json_out: bool = typer.Option(False, "--json", help="print the status as JSON")) -> None:
    """Start NATS, PostgreSQL, S3, the six services and the dashboard on this machine; write the profile."""
    from levers9.cli_secrets import ensure_keyring
    from levers9.runtime.tokens import mint
    from levers9.stack import Stack, StackError

    s = settings()
    profile = s.home_path / "config.toml"
    if ensure_keyring(s, profile):  # seals secrets and checkpoints; a 0600 file named in the profile
        s = settings()
    if s.bus.auth is None:  # credentials on the bus unless the profile or environment says `off`
        write_profile(profile, {"nats_auth": "on"})
        s = settings()
    if not _given("cache_port", profile):
        # this home's node cache on a port of its own: a second home on the machine would find the
        # default taken by the first's cache, which its workers refuse (another home's S3)
        from levers9.runtime.ports import free_port

        write_profile(profile, {"cache_port": free_port()})
        s = settings()
    try:
        with console.status("starting levers9") as spinner:
            def progress(msg: str) -> None:
                spinner.update(msg)
                console.print(f"  {msg}")

            urls = Stack(s.home_path, s).start_servers(progress=progress)
            if not s.worker.token:  # the static worker local-1 gets a token valid for it alone
                worker_token = mint(name="worker local-1", scope="worker:local-1")
                asyncio.run(publish_event(urls["nats_url"], worker_token.event))
                write_profile(profile, {"worker_token": worker_token.secret})
                s = settings()
            stack = Stack(s.home_path, s)
            state = stack.up(progress=progress)
            spinner.update("creating a token for workspace default")
            gateway_url = state["gateway_url"]
            token = ensure_token(s, gateway_url, urls["nats_url"])
    except StackError as exc:
        fail(str(exc))
    write_profile(profile, {"gateway_url": gateway_url, "token": token})
    console.print(f"levers9 is up. Profile: {profile}")
    show_status(stack, json_out)


def _given(name: str, profile: Path) -> bool:
    """Whether the environment or the profile names setting `name` (its default is not a choice)."""
    return name in Settings.load(profile=profile).given


def ensure_token(s: Settings, gateway_url: str, nats_url: str) -> str:
    """Keep the profile's token if the gateway accepts it; otherwise create one for `default`."""
    import httpx

    def accepted(token: str) -> bool:
        try:
            r = httpx.get(f"{gateway_url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=2)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    from levers9.runtime.tokens import mint

    if s.client.token and accepted(s.client.token):
        return s.client.token
    minted = mint(name="levers9 up")
    asyncio.run(publish_event(nats_url, minted.event))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if accepted(minted.secret):
            return minted.secret
        time.sleep(0.2)
    fail("the gateway did not accept the new token within 20 s; see the gateway log under "
         f"{s.home_path / 'logs'}")
    return ""


async def publish_token(nats_url: str, token: str, name: str, workspace: str = "default",
                        scope: str = "workspace", auth=None) -> str:
    """Make the secret `token` valid (TokenCreated with its hash); returns the token id."""
    from levers9.contracts import events as E
    from levers9.contracts import uuid7
    from levers9.runtime.tokens import token_hash

    token_id = uuid7()
    await publish_event(nats_url, E.TokenCreated(token_id=token_id, name=name, scope=scope,
                                                 token_sha256=token_hash(token)), workspace, auth)
    return token_id


async def publish_event(nats_url: str, event, workspace: str = "default", auth=None) -> None:
    """Append one event (a TokenCreated from runtime.tokens.mint) through a short-lived connection."""
    from levers9.contracts import envelope
    from levers9.runtime.bus import Bus

    bus = await Bus.connect(nats_url, name="levers9-cli", auth=auth or bus_auth())
    try:
        await bus.ensure_topology()
        await bus.publish(envelope(event, workspace=workspace))
    finally:
        await bus.close()


@app.command()
def down() -> None:
    """Stop everything `levers9 up` started; the data stays for the next `up`."""
    from levers9.stack import Stack

    s = settings()
    with console.status("stopping levers9") as spinner:
        def progress(msg: str) -> None:
            spinner.update(msg)
            console.print(f"  {msg}")

        Stack(s.home_path, s).down(progress=progress)
    console.print("levers9 is down.")


@app.command()
def status(json_out: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Show every component and whether it is healthy."""
    from levers9.stack import Stack

    s = settings()
    healthy = show_status(Stack(s.home_path, s), json_out)
    raise typer.Exit(0 if healthy else 1)


def show_status(stack, json_out: bool) -> bool:
    comps = stack.status()
    s = settings()
    gateway = next((c.url for c in comps if c.name == "gateway"), "")
    if json_out:
        doc = {"gateway_url": s.client.gateway_url or gateway,
               "components": [{"name": c.name, "healthy": c.healthy, "url": c.url, "detail": c.detail}
                              for c in comps]}
        out.print_json(json.dumps(doc))
    else:
        table = Table("component", "healthy", "url", "detail")
        for c in comps:
            table.add_row(c.name, "[green]yes[/green]" if c.healthy else "[red]no[/red]", without_password(c.url),
                          c.detail)
        out.print(table)
    return all(c.healthy for c in comps)


def without_password(url: str) -> str:
    """A URL as the status table shows it: a password in it (Postgres's superuser's) is not printed
    where a screen or a terminal log may keep it; `--json` has it, for the tools of the home's owner."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


# ---- events -------------------------------------------------------------------------------------

def parse_time(value: str | None) -> dt.datetime | None:
    """An ISO time, or a duration ago such as 90s, 15m, 2h, 1d."""
    if not value:
        return None
    m = re.fullmatch(r"(\d+)([smhd])", value)
    if m:
        seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds)
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        fail(f"--since/--until {value!r} is neither an ISO time nor a duration like 15m")
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)




@events_app.command("replay")
def replay(
    workspace: Optional[str] = typer.Option(None, help="only this workspace (_sys: platform events)"),
    aggregate: Optional[str] = typer.Option(None, help="container, worker, deployment, checkpoint, …"),
    aggregate_id: Optional[str] = typer.Option(None, "--aggregate-id", help="only this aggregate"),
    event_type: Optional[str] = typer.Option(None, "--type", help="only this event type"),
    correlation_id: Optional[str] = typer.Option(None, "--correlation-id", help="only this correlation"),
    since: Optional[str] = typer.Option(None, help="from this time (ISO, or 15m/2h/1d ago)"),
    until: Optional[str] = typer.Option(None, help="up to this time (ISO, or a duration ago)"),
    from_seq: int = typer.Option(1, "--from-seq", help="first stream sequence"),
    to_seq: Optional[int] = typer.Option(None, "--to-seq", help="last stream sequence"),
    json_out: bool = typer.Option(False, "--json", help="JSON lines: one envelope per line"),
) -> None:
    """Print the log for a range, filtered, as a table or JSON lines."""
    from levers9.contracts import InvalidName, subjects

    try:
        filt = subjects.filter_subject(workspace, aggregate, aggregate_id, event_type)
    except InvalidName as exc:
        fail(str(exc))
    nats_url = need(server_urls(settings())["nats_url"], "nats_url")
    count = asyncio.run(_replay(nats_url, filt, correlation_id, parse_time(since), parse_time(until), from_seq,
                                to_seq, json_out))
    console.print(f"{count} events", style="dim")


async def _replay(nats_url: str, filt: str, correlation_id: str | None, since, until, from_seq: int,
                  to_seq: int | None, json_out: bool) -> int:
    import msgspec

    from levers9.runtime.bus import Bus
    from levers9.runtime.reader import read, seq_at_time

    class Head(msgspec.Struct):  # only what filtering and the table need
        id: str = ""
        type: str = ""
        occurred_at: str = ""
        workspace: str = ""
        correlation_id: str = ""

    head = msgspec.json.Decoder(Head)
    bus = await Bus.connect(nats_url, name="levers9-replay", auth=bus_auth())
    count = 0
    table = None if json_out else Table("seq", "occurred_at", "type", "subject", "correlation_id")
    write = sys.stdout.buffer.write
    try:
        start = max(from_seq, await seq_at_time(bus, since)) if since else from_seq
        end = to_seq
        if until:
            end = min(to_seq or 1 << 62, await seq_at_time(bus, until) - 1)
        async for msgs in read(bus, [filt], start_seq=start, end_seq=end):
            if json_out and not correlation_id:  # nothing to look at: write the envelopes as they are
                count += len(msgs)
                write(b"\n".join(m.data for m in msgs) + b"\n")
                continue
            lines = []
            for m in msgs:
                try:
                    h = head.decode(m.data)
                except msgspec.DecodeError:
                    h = Head(type="<undecodable>")
                if correlation_id and h.correlation_id != correlation_id:
                    continue
                count += 1
                if json_out:
                    lines.append(m.data)
                elif table is not None:
                    table.add_row(str(m.metadata.sequence.stream), h.occurred_at, h.type, m.subject,
                                  h.correlation_id)
            if lines:
                write(b"\n".join(lines) + b"\n")
    finally:
        await bus.close()
    if table is not None:
        out.print(table)
    sys.stdout.flush()
    return count


@events_app.command("tail")
def tail(
    workspace: Optional[str] = typer.Option(None), aggregate: Optional[str] = typer.Option(None),
    event_type: Optional[str] = typer.Option(None, "--type"),
    last: int = typer.Option(0, help="start with the last N matching events"),
) -> None:
    """Follow the log live (Ctrl-C to stop); JSON lines."""
    from levers9.contracts import InvalidName, subjects

    try:
        filt = subjects.filter_subject(workspace, aggregate, None, event_type)
    except InvalidName as exc:
        fail(str(exc))
    nats_url = need(server_urls(settings())["nats_url"], "nats_url")
    try:
        asyncio.run(_tail(nats_url, filt, last))
    except KeyboardInterrupt:
        pass


async def _tail(nats_url: str, filt: str, last: int) -> None:
    from nats.js.api import DeliverPolicy

    from levers9.runtime.bus import Bus

    bus = await Bus.connect(nats_url, name="levers9-tail", auth=bus_auth())
    start = None
    if last:
        end = await bus.last_seq(filt)
        start = max(1, end - last + 1) if end else None
    kwargs = ({"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": start} if start
              else {"deliver_policy": DeliverPolicy.NEW})
    from nats.js.api import ConsumerConfig

    sub = await bus.js.subscribe(filt, ordered_consumer=True, config=ConsumerConfig(**kwargs))
    try:
        async for msg in sub.messages:
            sys.stdout.buffer.write(msg.data + b"\n")
            sys.stdout.flush()
    finally:
        await bus.close()


@events_app.command("example")
def example(event_type: str = typer.Argument(..., help="an event type, e.g. ContainerRequested"),
            workspace: str = typer.Option("default")) -> None:
    """Print a valid envelope of TYPE, ready to publish on the subject printed to stderr."""
    from levers9.contracts import EVENT_TYPES, encode
    from levers9.contracts.examples import example_envelope

    if event_type not in EVENT_TYPES:
        fail(f"unknown event type {event_type!r}; known: {', '.join(sorted(EVENT_TYPES))}")
    env = example_envelope(event_type, workspace)
    out.print_json(encode(env).decode())
    console.print(f"subject: {env.subject}", style="dim")


@contracts_app.command("schema")
def schema(directory: Path = typer.Argument(..., help="where to write one JSON Schema per event")) -> None:
    """Write the JSON Schema of every event's envelope."""
    from levers9.contracts.schema import write_schemas

    written = write_schemas(directory)
    console.print(f"wrote {len(written)} schemas to {directory}")


@projections_app.command("rebuild")
def rebuild_cmd(name: str = typer.Argument(..., help=f"a service: {', '.join(SERVICES)}"),
                swap: bool = typer.Option(True, help="swap the rebuilt tables in (--no-swap: compare only)"),
                json_out: bool = typer.Option(False, "--json")) -> None:
    """Rebuild a service's projections from sequence 1 into fresh tables, compare, swap them in."""
    from levers9.services import service_class

    cls = service_class(name)
    s = settings()
    urls = server_urls(s)
    report = asyncio.run(_rebuild(need(urls["nats_url"], "nats_url"), need(urls["database_url"], "database_url"),
                                  cls, swap))
    doc = {"schema": report.schema, "events_applied": report.events_applied, "positions": report.positions,
           "equal": report.equal, "swapped": report.swapped,
           "tables": [{"table": t.table, "live_rows": t.live_rows, "rebuilt_rows": t.rebuilt_rows,
                       "only_live": t.only_live, "only_rebuilt": t.only_rebuilt} for t in report.tables]}
    if json_out:
        out.print_json(json.dumps(doc))
    else:
        table = Table("table", "live rows", "rebuilt rows", "only live", "only rebuilt")
        for t in report.tables:
            table.add_row(t.table, str(t.live_rows), str(t.rebuilt_rows), str(t.only_live), str(t.only_rebuilt))
        out.print(table)
        out.print(f"{report.events_applied} events applied; rebuilt {'equals' if report.equal else 'DIFFERS FROM'} "
                  f"live; {'swapped in' if report.swapped else 'not swapped'}")


async def _rebuild(nats_url: str, database_url: str, cls, swap: bool):
    import asyncpg

    from levers9.runtime.bus import Bus
    from levers9.runtime.projection import schema_for
    from levers9.runtime.rebuild import rebuild

    bus = await Bus.connect(nats_url, name="levers9-rebuild", auth=bus_auth())
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    try:
        return await rebuild(bus, pool, schema_for(cls.name), cls.projections, swap=swap)
    finally:
        await pool.close()
        await bus.close()


def main() -> None:
    _check_settings()
    app()


def _check_settings() -> None:
    """Stop on a setting that does not parse; warn (one line, stderr) of LEVERS9_* names that are no setting."""
    try:
        s = Settings.load()
    except SettingError as exc:
        print(f"levers9: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except (OSError, ValueError):  # an unreadable profile: the commands that need it say so
        return
    if s.unknown_env:
        print(f"levers9: warning: {unknown_warning(s)}", file=sys.stderr)


if __name__ == "__main__":
    main()
