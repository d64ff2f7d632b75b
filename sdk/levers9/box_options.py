"""The options only a box has (`app.box(name, command=[...], port=..., ready_path=...)`), checked
where the user wrote them: a mistake raises ConfigError saying how to fix it. The gateway checks
them again (levers9.contracts.spec.BoxOptions) and answers 422 naming the field.

Standard library only (this package is mounted alone inside containers).
"""

from __future__ import annotations

import re
from typing import Any

from levers9.options import ConfigError

MAX_ARGUMENTS = 256  # levers9.contracts.spec.MAX_BOX_ARGUMENTS
MAX_ARGUMENT_CHARS = 8192
READY_PATH_RE = re.compile(r"^/[!-~]*$")  # levers9.contracts.spec.ReadyPath
# options of a box that mean nothing for a program the runner does not serve
NOT_FOR_BOXES = ("on_start", "function")
EXAMPLE = "command=['python3', '-m', 'http.server', '8000'], port=8000"


def command_of(command: Any) -> list[str]:
    """The program and its arguments (argv: no shell unless the command names one)."""
    if isinstance(command, str):
        raise ConfigError(f"command {command!r} is a string: give the program and its arguments as a list, "
                          f"e.g. {EXAMPLE} (or ['sh', '-c', {command!r}] for a shell line)")
    if not isinstance(command, (list, tuple)) or not command:
        raise ConfigError(f"command {command!r} is not valid: give the program and its arguments as a non-empty "
                          f"list, e.g. {EXAMPLE}")
    if len(command) > MAX_ARGUMENTS:
        raise ConfigError(f"command has {len(command)} arguments; at most {MAX_ARGUMENTS}: put the rest in a file")
    for i, arg in enumerate(command):
        if not isinstance(arg, str) or "\0" in arg or len(arg) > MAX_ARGUMENT_CHARS or not _utf8(arg):
            raise ConfigError(f"command[{i}] {str(arg)[:60]!r} is not valid: each argument is a string (UTF-8, "
                              f"without NUL) of at most {MAX_ARGUMENT_CHARS} characters")
    if not command[0].strip():
        raise ConfigError(f"command[0] {command[0]!r} is empty: name the program to run, e.g. {EXAMPLE}")
    return list(command)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no JSON the gateway reads can carry it
        return False
    return True


def port_of(port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"port {port!r} is not valid: the TCP port the program listens on inside its container, "
                          "1 to 65535, e.g. port=8000")
    return port


def ready_path_of(path: Any) -> str | None:
    if path is None:
        return None
    if not isinstance(path, str) or len(path) > 2048 or not READY_PATH_RE.match(path):
        raise ConfigError(f"ready_path {path!r} is not valid: an absolute path without spaces, e.g. "
                          "ready_path='/health' (None: the box is ready once its port accepts a connection)")
    return path


def box_section(command: Any, port: Any, ready_path: Any, idle_checkpoint: Any = False) -> dict[str, Any]:
    """The spec's `box` section (levers9.contracts.spec.BoxOptions)."""
    if not isinstance(idle_checkpoint, bool):
        raise ConfigError(f"idle_checkpoint {idle_checkpoint!r} is not valid: True (dump it when it is stopped "
                          "idle, and restore that next) or False")
    section: dict[str, Any] = {"command": command_of(command), "port": port_of(port)}
    if idle_checkpoint:
        section["idle_checkpoint"] = True
    path = ready_path_of(ready_path)
    if path is not None:
        section["ready_path"] = path
    return section


def refuse_runner_options(options: dict[str, Any]) -> None:
    """A box runs its own program: the runner's options are refused with a sentence."""
    for key in NOT_FOR_BOXES:
        if key in options:
            raise ConfigError(f"app.box takes no {key}: a box runs its command, not a Python handler "
                              "(start what it needs in the command itself)")
