"""A sandbox's rules as pure functions: where a file path may point, how big a file may be, and the
exit code an exec reports. Standard library only: the agent inside the sandbox (sandbox_ops) and the
gateway (an early refusal, before the sandbox is reached) decide with the same code.

The files API is rooted at the sandbox's workdir: a relative path is taken from there, an absolute
one must lie inside it, and `..` may not climb out. A symbolic link is judged by where it leads
(`resolved_inside`, given the link's target as the agent resolved it): a link to /etc is refused.
The container is the real boundary (the agent runs inside it, confined like every container); these
rules make the API's promise exact and its refusals sentences.
"""

from __future__ import annotations

import errno
import posixpath
import signal

MAX_FILE_BYTES = 32 << 20  # a file written or read through the files API (413 above)
MAX_PATH_CHARS = 4096
NOT_FOUND_CODE = 127  # the shell's: "command not found"
NOT_EXECUTABLE_CODE = 126  # the shell's: found but cannot be executed
TIMED_OUT_CODE = 124  # timeout(1)'s: the exec ran past its timeout and was killed
MAX_EXEC_TIMEOUT_S = 86_400.0


class Refused(ValueError):
    """A request the sandbox refuses; `status` is the HTTP status that says so."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def confine(root: str, path: str) -> str:
    """The normalized absolute path that `path` names under `root` (relative paths from `root`);
    Refused(400) for an empty or malformed path, Refused(403) for one that leaves `root`."""
    if not isinstance(path, str) or not path or "\x00" in path or len(path) > MAX_PATH_CHARS:
        raise Refused(400, f"the path {str(path)[:80]!r} is not a valid path (empty, too long, or with a NUL byte)")
    base = posixpath.normpath(root)
    if not base.startswith("/"):
        raise Refused(400, f"the sandbox's root {root!r} is not an absolute path")
    joined = posixpath.normpath(path if path.startswith("/") else posixpath.join(base, path))
    if joined.startswith("//"):  # POSIX keeps a leading '//' as is: it still means '/'
        joined = "/" + joined.lstrip("/")
    if not inside(base, joined):
        raise Refused(403, f"the path {path[:200]!r} leaves the sandbox's root {base}: files are read and "
                           f"written under {base} only")
    return joined


def inside(root: str, path: str) -> bool:
    """Whether the normalized absolute `path` is `root` or below it."""
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/") or root == "/"


def resolved_inside(root_resolved: str, target_resolved: str, asked: str) -> None:
    """Refused(403) when a path, once its symbolic links are followed (`target_resolved`), leads out of
    the root (itself resolved)."""
    if not inside(root_resolved, target_resolved):
        raise Refused(403, f"the path {asked[:200]!r} leads out of the sandbox's root through a symbolic link "
                           f"(to {target_resolved[:200]}): refused")


def check_size(size: int, limit: int = MAX_FILE_BYTES, what: str = "the file") -> None:
    """Refused(413) when `size` bytes are over the files API's limit."""
    if size > limit:
        raise Refused(413, f"{what} is {size} bytes, over the sandbox's file limit of {limit} bytes "
                           f"({limit >> 20} MiB): split it, or put large data in a volume")


def exit_code(returncode: int) -> int:
    """A process's exit status as a shell reports it: its code, or 128 + the signal that killed it."""
    return 128 - returncode if returncode < 0 else returncode


def spawn_failure(program: str, err: OSError) -> tuple[int, str]:
    """The exit code and the stderr line of an exec whose program could not start (a shell's)."""
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return NOT_FOUND_CODE, f"{program}: command not found\n"
    if err.errno in (errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.EISDIR):
        return NOT_EXECUTABLE_CODE, f"{program}: cannot execute: {err.strerror}\n"
    return NOT_EXECUTABLE_CODE, f"{program}: cannot start: {err.strerror or err}\n"


def check_argv(argv: object) -> list[str]:
    """An exec's program and arguments: a non-empty list of strings without NUL; Refused(400) otherwise."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise Refused(400, "exec takes the program and its arguments as a non-empty list of strings")
    if not argv[0] or any("\x00" in a for a in argv):
        raise Refused(400, "exec: the program is empty or an argument holds a NUL byte")
    return argv


def check_exec_timeout(value: object) -> float | None:
    """An exec's timeout: absent (None: it runs as long as the sandbox), or seconds in (0, 86400];
    Refused(400) otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_EXEC_TIMEOUT_S:
        raise Refused(400, f"exec: timeout must be a number of seconds above 0 and at most {MAX_EXEC_TIMEOUT_S:.0f}")
    return float(value)


def signal_name(code: int) -> str:
    """'SIGKILL' for 137; '' when the code is no signal's."""
    try:
        return signal.Signals(code - 128).name if code > 128 else ""
    except ValueError:
        return ""
