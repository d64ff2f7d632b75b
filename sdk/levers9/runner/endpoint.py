"""Serving an endpoint function: query parameters and the JSON body's fields become its keyword
arguments (`context` too when it asks for it), its return value goes back as JSON."""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import uuid
from typing import Any
from urllib.parse import SplitResult, parse_qsl

from levers9.runner.exchange import Exchange
from levers9.runner.runtime import Context, DeadlineExceeded, error_body, log, print_exception

MAX_JSON_DEPTH = 100  # arrays and objects inside each other in a body (the gateway's limit too)


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def serve_endpoint(h: Exchange, url: SplitResult, body: bytes) -> None:
    rt = h.server.runtime
    kwargs = inputs(url.query, body)
    headers = {k.lower(): v for k, v in h.headers.items()}
    if rt.wants_context:
        if "context" in kwargs:
            raise BadRequest(422, "'context' is reserved for the request's context: rename that input")
        kwargs["context"] = Context(on_start_value=rt.on_start_value,
                                    request_id=headers.get("x-request-id") or uuid.uuid4().hex,
                                    path=url.path, method=h.command, headers=headers)
    signature = inspect.signature(rt.target)
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        shown = signature.replace(parameters=[p for n, p in signature.parameters.items() if n != "context"])
        raise BadRequest(422, f"the inputs do not fit {rt.config.handler}{shown}: {exc}") from None
    future = rt.call(kwargs)
    done, _ = concurrent.futures.wait([future], timeout=rt.config.timeout or None)
    if not done:
        future.add_done_callback(_report_late_end)  # the function goes on; say how it ends
        return h.send_json(504, {"error": f"DeadlineExceeded: the request did not finish within "
                                          f"{rt.config.timeout:g} s"})
    failure = future.exception()
    if isinstance(failure, DeadlineExceeded):
        return h.send_json(504, {"error": f"DeadlineExceeded: {failure}"})
    if failure is not None:
        print_exception(failure)
        return h.send_json(500, error_body(failure))
    try:
        data = json.dumps(future.result()).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        return h.send_json(500, {"error": f"{type(exc).__name__}: the return value is not JSON ({exc}): "
                                          "return dicts, lists, strings, numbers, booleans or None"})
    h.send_json(200, None, encoded=data)


def _report_late_end(future: concurrent.futures.Future) -> None:
    """A call answered 504 ended later: its exception goes to the log like any other."""
    exc = future.exception()
    if exc is not None:
        log(f"a call answered 504 ended later with {type(exc).__name__}: {exc}")
        print_exception(exc)


TOO_DEEP = object()


def depth_over(doc: Any, limit: int) -> bool:
    """Whether decoded JSON nests arrays and objects more than `limit` deep (iterative: no recursion)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False


def inputs(query: str, body: bytes) -> dict[str, Any]:
    """Query parameters (strings; a list when repeated), then the JSON object body's fields."""
    kwargs: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in kwargs:
            kwargs[key] = (kwargs[key] if isinstance(kwargs[key], list) else [kwargs[key]]) + [value]
        else:
            kwargs[key] = value
    if not body.strip():
        return kwargs
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(400, f"the body is not JSON (not UTF-8: an invalid byte at offset {exc.start}): send a "
                              "JSON object in UTF-8 whose fields are the function's arguments") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        doc = TOO_DEEP
    except ValueError as exc:
        raise BadRequest(400, f"the body is not JSON ({str(exc)[:200]}): send a JSON object whose fields are the "
                              "function's arguments, e.g. {\"name\": \"world\"}") from None
    if doc is TOO_DEEP or depth_over(doc, MAX_JSON_DEPTH):
        raise BadRequest(400, f"the body's JSON nests deeper than {MAX_JSON_DEPTH} levels of arrays and objects: "
                              "send a flatter document")
    if not isinstance(doc, dict):
        raise BadRequest(400, f"the body is a JSON {type(doc).__name__}, not an object: send a JSON object "
                              "whose fields are the function's arguments, e.g. {\"name\": \"world\"}")
    kwargs.update(doc)
    return kwargs
