"""Sandboxes over REST (the SDK's `Sandbox` speaks this; so can any language):

    POST   /api/v1/sandboxes                         create (waits until it runs) -> {sandbox_id, ...}
    GET    /api/v1/sandboxes[?all=true]              this workspace's sandboxes
    GET    /api/v1/sandboxes/{id}                    one
    DELETE /api/v1/sandboxes/{id}                    terminate
    POST   /api/v1/sandboxes/{id}/exec               {argv, env, workdir, timeout} -> NDJSON, streamed as written:
                                                     {"exec_id", "pid"}, {"fd": 1|2, "data"}..., {"exit_code"}
                                                     (124 and "timed_out": true past `timeout` seconds)
    POST   /api/v1/sandboxes/{id}/exec/{exec_id}/stdin[?close=true]   body: the bytes
    PUT|GET|DELETE /api/v1/sandboxes/{id}/files?path=P                write, read, remove a file
    GET    /api/v1/sandboxes/{id}/ls?path=P          a directory's entries
    POST   /api/v1/sandboxes/{id}/snapshot           -> {snapshot_id}: restore it with from_snapshot

Another workspace's sandbox is none (404). Paths are checked here first (sandbox_rules.confine: 400
or 403 with a sentence) and again by the agent inside the container, which also follows symbolic
links; nothing of the request runs on this host.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response, StreamingResponse

from levers9.contracts.sandboxes import decode_request
from levers9.contracts.spec import InvalidSpec
from levers9.executor.sandbox_rules import Refused, check_argv, check_exec_timeout, check_size, confine

from . import sandbox_agent as agent
from . import sandbox_store as store
from .auth import User
from .deps import Gateway

router = APIRouter()
# stdin and a file's content are bytes as sent, never JSON (body_rules.py): said so in the spec
RAW_BODY = {"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
# ... and what an exec streams and a file read answers (besides JSON errors)
NDJSON_OUT = {"responses": {"200": {"description": "The exec's output, one JSON object a line, as written",
                                    "content": {"application/x-ndjson": {"schema": {"type": "string"}}}}}}
BYTES_OUT = {"responses": {"200": {"description": "The file's bytes",
                                   "content": {"application/octet-stream": {"schema": {"type": "string"}}}}}}
BASE = "/api/v1/sandboxes"


def refusal(exc: Exception) -> HTTPException:
    status = getattr(exc, "status", 500)
    return HTTPException(status, str(exc))


async def _found(gw: Any, workspace: str, sandbox_id: str, ready: bool = True) -> store.Found:
    try:
        return await store.find(gw, workspace, sandbox_id, ready)
    except store.SandboxError as exc:
        raise refusal(exc) from None


async def _ask(found: store.Found, header: dict[str, Any], body: bytes = b"") -> tuple[dict[str, Any], bytes]:
    try:
        return await agent.request(found.address, header, body)
    except agent.AgentError as exc:
        raise refusal(exc) from None


def _path(found: store.Found, path: str) -> str:
    try:
        return confine(found.workdir, path)
    except Refused as exc:
        raise refusal(exc) from None


@router.post(BASE, status_code=201)
async def create_sandbox(request: Request, caller: User, gw: Gateway) -> dict[str, Any]:
    try:
        req = decode_request(await request.body())
        return await store.create(gw, caller.workspace, req, caller.token_id)
    except InvalidSpec as exc:
        raise HTTPException(422, str(exc)) from None
    except store.SandboxError as exc:
        raise refusal(exc) from None


@router.get(BASE)
async def list_sandboxes(caller: User, gw: Gateway, all: bool = False) -> list[dict[str, Any]]:
    return await store.listing(gw, caller.workspace, all)


@router.get(BASE + "/{sandbox_id}")
async def get_sandbox(sandbox_id: str, caller: User, gw: Gateway) -> dict[str, Any]:
    for s in await store.listing(gw, caller.workspace, all=True):
        if s["sandbox_id"] == sandbox_id:
            return s
    raise refusal(store.not_found(sandbox_id, caller.workspace))


@router.delete(BASE + "/{sandbox_id}")
async def terminate_sandbox(sandbox_id: str, caller: User, gw: Gateway) -> dict[str, Any]:
    found = await _found(gw, caller.workspace, sandbox_id, ready=False)
    if found.status in ("stopped", "failed", "stopping"):
        return {"sandbox_id": sandbox_id, "terminated": True, "already": True}
    await store.terminate(gw, caller.workspace, sandbox_id, "terminated by its owner")
    return {"sandbox_id": sandbox_id, "terminated": True}


@router.post(BASE + "/{sandbox_id}/exec", openapi_extra=NDJSON_OUT)
async def exec_in_sandbox(sandbox_id: str, request: Request, caller: User, gw: Gateway) -> StreamingResponse:
    try:
        ask = json.loads(await request.body() or b"{}")
        argv = check_argv(ask.get("argv") if isinstance(ask, dict) else None)
        env = ask.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise Refused(400, "exec: env must be an object of strings")
        timeout = check_exec_timeout(ask.get("timeout"))
    except (ValueError, Refused) as exc:
        raise HTTPException(getattr(exc, "status", 400), str(exc)) from None
    found = await _found(gw, caller.workspace, sandbox_id)
    header = {"kind": "exec", "argv": argv, "env": env, "root": found.workdir,
              "workdir": str(ask.get("workdir") or found.workdir), **({"timeout": timeout} if timeout else {})}
    frames = agent.exec_frames(found.address, header)
    try:
        first, _ = await frames.__anext__()  # a refusal answers with its status, not a 200 stream
    except agent.AgentError as exc:
        raise refusal(exc) from None
    return StreamingResponse(ndjson(first, frames), media_type="application/x-ndjson")


async def ndjson(first: dict[str, Any], frames: AsyncGenerator[tuple[dict[str, Any], bytes], None]
                 ) -> AsyncIterator[bytes]:
    """The exec as lines of JSON, each sent as soon as its bytes came (text decoded per stream: a
    character split between two chunks is joined, not replaced)."""
    decoders = {1: codecs.getincrementaldecoder("utf-8")("replace"), 2: codecs.getincrementaldecoder("utf-8")("replace")}
    yield line({"exec_id": first.get("exec_id", ""), "pid": first.get("pid", 0)})
    try:
        async for frame, data in frames:
            if frame.get("kind") == "stream":
                fd = 2 if frame.get("fd") == 2 else 1
                text = decoders[fd].decode(data)
                if text:
                    yield line({"fd": fd, "data": text})
            elif frame.get("kind") == "exit":
                yield line({"exit_code": int(frame.get("code", 1)), **({"timed_out": True} if frame.get("timed_out") else {})})
    except agent.AgentError as exc:
        yield line({"error": str(exc), "exit_code": None})
    finally:
        await frames.aclose()  # the caller went away: the connection closes, the program runs on


def line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


@router.post(BASE + "/{sandbox_id}/exec/{exec_id}/stdin", openapi_extra=RAW_BODY)
async def write_stdin(sandbox_id: str, exec_id: str, request: Request, caller: User, gw: Gateway,
                      close: bool = False) -> dict[str, Any]:
    found = await _found(gw, caller.workspace, sandbox_id)
    answer, _ = await _ask(found, {"kind": "stdin", "exec_id": exec_id, "close": close}, await request.body())
    return {"written": answer.get("written", 0), "closed": close}


@router.put(BASE + "/{sandbox_id}/files", openapi_extra=RAW_BODY)
async def write_file(sandbox_id: str, path: str, request: Request, caller: User, gw: Gateway) -> dict[str, Any]:
    found = await _found(gw, caller.workspace, sandbox_id)
    where = _path(found, path)
    body = await request.body()
    try:
        check_size(len(body))
    except Refused as exc:
        raise refusal(exc) from None
    answer, _ = await _ask(found, {"kind": "file-write", "root": found.workdir, "path": where}, body)
    return {"path": where, "size": answer.get("size", len(body))}


@router.get(BASE + "/{sandbox_id}/files", openapi_extra=BYTES_OUT)
async def read_file(sandbox_id: str, path: str, caller: User, gw: Gateway) -> Response:
    found = await _found(gw, caller.workspace, sandbox_id)
    _, data = await _ask(found, {"kind": "file-read", "root": found.workdir, "path": _path(found, path)})
    return Response(content=data, media_type="application/octet-stream")


@router.delete(BASE + "/{sandbox_id}/files")
async def remove_file(sandbox_id: str, path: str, caller: User, gw: Gateway, recursive: bool = False) -> dict[str, Any]:
    found = await _found(gw, caller.workspace, sandbox_id)
    where = _path(found, path)
    await _ask(found, {"kind": "file-rm", "root": found.workdir, "path": where, "recursive": recursive})
    return {"path": where, "removed": True}


@router.get(BASE + "/{sandbox_id}/ls")
async def list_files(sandbox_id: str, caller: User, gw: Gateway, path: str = ".") -> dict[str, Any]:
    found = await _found(gw, caller.workspace, sandbox_id)
    where = _path(found, path)
    answer, _ = await _ask(found, {"kind": "file-ls", "root": found.workdir, "path": where})
    return {"path": where, "entries": answer.get("entries", [])}


@router.post(BASE + "/{sandbox_id}/snapshot")
async def snapshot_sandbox(sandbox_id: str, caller: User, gw: Gateway) -> dict[str, Any]:
    found = await _found(gw, caller.workspace, sandbox_id)
    try:
        return {"sandbox_id": sandbox_id, **await store.snapshot(gw, caller.workspace, found)}
    except store.SandboxError as exc:
        raise refusal(exc) from None
