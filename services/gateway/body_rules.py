"""What a request body may be, per route, and why a body is refused: pure functions, no I/O.

Every body the gateway reads is held to a limit (413 naming it) and, on a JSON route, must be UTF-8
JSON nested at most MAX_JSON_DEPTH deep (400 with a sentence): checked once, in body_limits.py,
before any route sees the body, so no route answers a hostile body with a 500 (a RecursionError of
10,000 nested arrays) or echoes it back whole. Calls to endpoints and boxes are proxied as they
come (routes_invoke holds their own limit) and the runner inside the container checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from levers9.executor.sandbox_rules import MAX_FILE_BYTES

MAX_JSON_DEPTH = 100  # arrays and objects inside each other; a blueprint or a spec needs fewer than 10
API_JSON_LIMIT = 1 << 20  # a JSON body of the user API (a blueprint, a token's name, a container request)
CATALOGUE_LIMIT = 8 << 20  # a catalogue document (routes_catalogues)
TASK_PAYLOAD_LIMIT = 256 << 10  # a task's arguments: its TaskEnqueued must fit one message of the log (1 MiB)
FORM_OVERHEAD = 1 << 20  # a deploy's spec field and the multipart framing, beside its code archive
NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PROXIED = ("/endpoint/", "/box/")  # streamed to a container as they come: routes_invoke's own limit


@dataclass(frozen=True)
class BodyRule:
    limit: int  # bytes
    json: bool  # a non-empty body must be JSON (UTF-8, at most MAX_JSON_DEPTH deep)
    what: str  # what the 413 calls this body


def body_rule(method: str, path: str, *, code_limit: int, file_limit: int, call_limit: int) -> BodyRule | None:
    """The rule for a request's body; None where the gateway does not read it (proxied calls, GETs)."""
    if method.upper() in NO_BODY_METHODS or path.startswith(PROXIED):
        return None
    if path == "/api/v1/deployments":
        return BodyRule(code_limit + FORM_OVERHEAD, False, "a deploy (its spec and code archive)")
    if path.startswith("/api/v1/volumes/") and "/files/" in path:
        return BodyRule(file_limit, False, "a file put into a volume")
    if path.startswith("/api/v1/sandboxes/") and raw_sandbox_body(method, path):  # bytes, not JSON
        return BodyRule(MAX_FILE_BYTES if path.endswith("/files") else API_JSON_LIMIT, False,
                        "a file written into a sandbox" if path.endswith("/files") else "a sandbox program's stdin")
    if path == "/api/v1/catalogues":
        return BodyRule(CATALOGUE_LIMIT, True, "a catalogue")
    if path.startswith("/function/"):
        return BodyRule(call_limit, True, "a function call's arguments")
    if path.startswith("/taskqueue/") and path.endswith("/batch") and path.count("/") == 3:
        return BodyRule(call_limit, True, "a batch of tasks (each task's arguments also at most 256 KiB)")
    if path.startswith("/taskqueue/"):
        return BodyRule(TASK_PAYLOAD_LIMIT, True, "a task's arguments")
    return BodyRule(API_JSON_LIMIT, True, "a JSON body of the API")


def raw_sandbox_body(method: str, path: str) -> bool:
    """A file's content (PUT .../files) or a program's stdin (POST .../stdin): bytes as sent, also for
    a method the route does not take (it answers 405, not a JSON rule's 400). A DELETE of a file is
    an API call like the rest: its body is held to the JSON rules."""
    return path.endswith("/stdin") or (path.endswith("/files") and method.upper() != "DELETE")


def mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n} bytes"


def too_large(rule: BodyRule, declared: int | None = None) -> str:
    said = f"the body is {declared} bytes" if declared is not None else "the body is larger"
    return (f"{said}; the limit for {rule.what} is {mib(rule.limit)} ({rule.limit} bytes): send less "
            "(large data belongs in a volume or an image)")


def declared_length(raw: str | None) -> int | None:
    """Content-Length as a number; None when absent; ValueError with a sentence when it is not one."""
    if raw is None:
        return None
    value = raw.strip()
    if not value.isdigit():
        raise ValueError(f"Content-Length {value[:40]!r} is not a number of bytes")
    return int(value)


def depth_over(doc: Any, limit: int) -> bool:
    """Whether `doc` (decoded JSON) nests arrays and objects more than `limit` deep. Iterative: a deep
    document costs no recursion here."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False


def json_problem(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> str:
    """Why `body` is not acceptable JSON ("" when it is, or when it is empty). The sentence never
    quotes the body."""
    if not body.strip():
        return ""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the body is not UTF-8 (an invalid byte at offset {exc.start}): send JSON encoded in UTF-8"
    too_deep = f"the JSON nests deeper than {max_depth} levels of arrays and objects: send a flatter document"
    try:
        doc = msgspec.json.decode(body)
    except RecursionError:
        return too_deep
    except msgspec.DecodeError as exc:
        return f"the body is not JSON ({str(exc)[:200]}): send a JSON document"
    return too_deep if depth_over(doc, max_depth) else ""


def text_problem(text: str, what: str, max_depth: int = MAX_JSON_DEPTH) -> str:
    """json_problem for JSON already decoded to text (a form field), naming what it is."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes that were not UTF-8
        return f"{what} is not UTF-8: send JSON encoded in UTF-8"
    problem = json_problem(data, max_depth)
    return problem.replace("the body", what, 1) if problem.startswith("the body") else (
        f"{what}: {problem}" if problem else "")
