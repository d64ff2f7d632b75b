"""`levers9 run FILE::FUNCTION [ARGS...]`: call a Python function of a file remotely, print its value.

Each ARG is a Python literal (`3`, `'a b'`, `[1, 2]`, `{'k': 1}`) or else a string; `KEY=VALUE` is a
keyword argument. A generator function's items are printed as they come.
"""

from __future__ import annotations

import ast
import json
import pprint
import re
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from levers9.cli_output import JSON_OPTION, console, errors, fail

KEYWORD_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


def literal(text: str) -> Any:
    """A Python literal, or the text itself when it is not one."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def parse_arguments(values: list[str]) -> tuple[list[Any], dict[str, Any]]:
    """Positional arguments and KEY=VALUE keyword arguments, each value a literal or a string."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for value in values:
        m = KEYWORD_RE.match(value)
        if m:
            kwargs[m.group(1)] = literal(m.group(2))
        elif kwargs:
            fail(f"positional argument {value!r} comes after a keyword argument: put KEY=VALUE arguments last")
        else:
            args.append(literal(value))
    return args, kwargs


def split_target(target: str) -> tuple[Path, str]:
    file, sep, name = target.rpartition("::")
    if not sep or not file or not name:
        fail(f"{target!r} names no function: write FILE::FUNCTION, e.g. hello.py::square")
    return Path(file), name


def show(value: Any, json_out: bool) -> None:
    if json_out:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            fail(f"the value (a {type(value).__name__}) is not JSON: run without --json to see it")
        sys.stdout.write(text + "\n")
    else:
        sys.stdout.write((value if isinstance(value, str) else pprint.pformat(value)) + "\n")
    sys.stdout.flush()


def run(target: str = typer.Argument(..., metavar="FILE::FUNCTION", help="the .py file and its @app.function"),
        arguments: Optional[list[str]] = typer.Argument(  # noqa: UP007 - typer reads the annotation
            None, metavar="[ARGS]...", help="Python literals (else strings); KEY=VALUE for keyword arguments"),
        json_out: bool = JSON_OPTION) -> None:
    """Call FUNCTION of FILE in a sandbox with ARGS and print what it returns (a generator: each item)."""
    from levers9.app import load_function
    from levers9.function_errors import FunctionError, RemoteError

    file, name = split_target(target)
    args, kwargs = parse_arguments(list(arguments or []))
    with errors():
        fn = load_function(file, name)
    try:
        if fn.is_generator:
            for item in fn.remote_gen(*args, **kwargs):
                show(item, json_out)
        else:
            show(fn.remote(*args, **kwargs), json_out)
    except KeyboardInterrupt:
        console.print("interrupted: the call was cancelled")
        raise typer.Exit(130) from None
    except FunctionError as exc:
        if not isinstance(exc, RemoteError):
            fail(str(exc))
        _remote_failure(exc)
    except Exception as exc:  # noqa: BLE001 - the function's own exception: its remote traceback, then exit 1
        _remote_failure(exc)


def _remote_failure(exc: BaseException) -> None:
    text = getattr(exc, "remote_traceback", "")
    if text:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
    console.print(f"[red]error:[/red] the function raised {escape(type(exc).__name__)}: {escape(str(exc))}")
    raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(context_settings={"ignore_unknown_options": True})(run)  # `levers9 run f.py::g -1` passes -1
