"""The connection to the gateway's function service: where it is, one gRPC channel per process,
the token as metadata, the unary calls (Describe, EndSession), gRPC statuses as precise errors,
and the HTTP of large values (PUT an input, GET a result).

Where: the profile key `functions_url` (host:port; LEVERS9_FUNCTIONS_URL) when set, else the
gateway's `GET /api/v1/functions/info` ({"grpc_address", "tls", "python"}). The gateway URL and the
token are the CLI's (LEVERS9_GATEWAY_URL, LEVERS9_TOKEN, then $LEVERS9_HOME/config.toml). TLS when
the gateway URL is https or the info says so; LEVERS9_CA_FILE names a CA bundle to trust.

Never imported inside a container: it needs grpc (levers9.functions imports it only when a call is made).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from levers9.contracts.proto import functions_pb2 as pb
from levers9.contracts.proto import functions_pb2_grpc as pb_grpc
from levers9.function_errors import (
    AuthenticationError,
    FunctionError,
    FunctionNotFoundError,
    GatewayError,
    GatewayUnavailableError,
    InvalidCallError,
    PythonVersionError,
    platform_error,
)
from levers9.runtime.config import SettingError, Settings, default_home

PROTOCOL = 1  # Hello.protocol: functions.proto's PROTOCOL
MAX_MESSAGE = 16 << 20  # gRPC messages, both ways
INFO_TIMEOUT = 10.0
HTTP_TIMEOUT = 300.0  # PUT or GET of one large value


def local_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


@dataclass(frozen=True)
class Target:
    """Where the function service listens and how to reach it."""
    address: str  # host:port
    tls: bool
    token: str
    ca_file: str = ""

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


# ---- where the service is ------------------------------------------------------------------------

_loaded: tuple[tuple[Any, ...], Settings] | None = None


def _settings_source() -> tuple[Any, ...]:
    """What the client's settings are read from: the LEVERS9_* variables, the home, and the profile
    file's identity and last change (a `levers9 up` that rewrites it is seen by the next call)."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("LEVERS9_")))
    profile = default_home() / "config.toml"  # where Settings.load reads it
    try:
        st = profile.stat()
        stamp: tuple[int, ...] = (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        stamp = ()
    return env, str(profile), stamp


def _settings() -> Settings:
    """The client's settings: LEVERS9_*, else the profile (levers9.runtime.config, stdlib only). Read
    again only when their source changed: reading and parsing them was ~0.5-2 ms of every `.remote`."""
    global _loaded
    source = _settings_source()
    loaded = _loaded
    if loaded is not None and loaded[0] == source:
        return loaded[1]
    try:
        settings = Settings.load()
    except (OSError, tomllib.TOMLDecodeError, SettingError) as exc:
        raise FunctionError(f"the settings cannot be read ({exc}): fix them, or run `levers9 up` again") from None
    _loaded = (source, settings)
    return settings


_lock = threading.Lock()
_infos: dict[tuple[str, str], dict[str, Any]] = {}  # (gateway_url, token) -> its functions/info


def resolve_target() -> Target:
    """Read the profile and find the function service (asking the gateway when no functions_url is set)."""
    client = _settings().client
    gateway_url, token, ca_file, address = client.gateway_url.rstrip("/"), client.token, client.ca_file, \
        client.functions_url
    tls = gateway_url.startswith("https://")
    if address:
        for scheme, secure in (("grpcs://", True), ("grpc://", False), ("https://", True), ("http://", False)):
            if address.startswith(scheme):
                address, tls = address[len(scheme):], secure or tls
        return Target(address.rstrip("/"), tls, token, ca_file)
    if not gateway_url:
        raise GatewayUnavailableError("no gateway is known: run `levers9 up`, or set LEVERS9_GATEWAY_URL (or "
                                      "LEVERS9_FUNCTIONS_URL, the function service's host:port)")
    with _lock:
        info = _infos.get((gateway_url, token))
    if info is None:
        info = _info(gateway_url, token)
        with _lock:
            _infos[(gateway_url, token)] = info
    address = str(info.get("grpc_address") or "")
    if not address:
        raise GatewayUnavailableError(f"the gateway at {gateway_url} named no grpc_address in "
                                      "/api/v1/functions/info: set LEVERS9_FUNCTIONS_URL to its host:port")
    return Target(address, tls or bool(info.get("tls")), token, ca_file)


def _info(gateway_url: str, token: str) -> dict[str, Any]:
    url = f"{gateway_url}/api/v1/functions/info"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=INFO_TIMEOUT) as r:
            doc = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise AuthenticationError(f"asking {url} where the function service is failed: {exc.code} {exc.reason}: "
                                      "run `levers9 up` or set LEVERS9_TOKEN", "UNAUTHENTICATED") from None
        raise GatewayUnavailableError(f"asking {url} where the function service is failed: {exc.code} {exc.reason}: "
                                      "is the gateway this version of levers9? Or set LEVERS9_FUNCTIONS_URL") from None
    except (OSError, ValueError) as exc:
        raise GatewayUnavailableError(f"cannot reach the gateway at {gateway_url} ({exc}): is levers9 running? "
                                      "`levers9 status`") from None
    if not isinstance(doc, dict):
        raise GatewayUnavailableError(f"{url} answered {doc!r}, not an object: set LEVERS9_FUNCTIONS_URL")
    return doc


# ---- one channel per process ---------------------------------------------------------------------

_channels: dict[tuple[str, bool, str], grpc.Channel] = {}


def _open_channel(target: Target) -> grpc.Channel:
    options = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE)]
    if not target.tls:
        return grpc.insecure_channel(target.address, options=options)
    root = None
    if target.ca_file:
        try:
            root = Path(target.ca_file).read_bytes()
        except OSError as exc:
            raise FunctionError(f"the CA file {target.ca_file} (LEVERS9_CA_FILE) cannot be read: {exc}") from None
    return grpc.secure_channel(target.address, grpc.ssl_channel_credentials(root_certificates=root), options=options)


def connect() -> tuple[pb_grpc.FunctionsStub, Target]:
    """The stub on this process's channel to the function service (opened once per address)."""
    target = resolve_target()
    key = (target.address, target.tls, target.ca_file)
    with _lock:
        channel = _channels.get(key)
        if channel is None:
            channel = _channels[key] = _open_channel(target)
    return pb_grpc.FunctionsStub(channel), target


def close_channels() -> None:
    """Close every channel (tests; a process that is done calling functions)."""
    with _lock:
        for channel in _channels.values():
            channel.close()
        _channels.clear()
        _infos.clear()


# ---- gRPC statuses as errors ---------------------------------------------------------------------

def rpc_error(exc: grpc.RpcError, what: str, address: str = "") -> FunctionError:
    """A gRPC failure as the precise FunctionError, carrying the gateway's details."""
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = (exc.details() if isinstance(exc, grpc.Call) else "") or str(exc)
    name = code.name if code is not None else "UNKNOWN"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return platform_error(f"timeout: {details}", what=what)
    if code == grpc.StatusCode.CANCELLED:
        return platform_error(f"cancelled: {details}", what=what)
    fixes: dict[Any, tuple[type[GatewayError], str]] = {
        grpc.StatusCode.UNAUTHENTICATED: (AuthenticationError, "run `levers9 up` or set LEVERS9_TOKEN"),
        grpc.StatusCode.PERMISSION_DENIED: (AuthenticationError, "use a token of a workspace allowed to call it"),
        grpc.StatusCode.NOT_FOUND: (FunctionNotFoundError, "check the names, or deploy it with `levers9 deploy FILE`"),
        grpc.StatusCode.INVALID_ARGUMENT: (InvalidCallError, "fix what the gateway names"),
        grpc.StatusCode.FAILED_PRECONDITION: (InvalidCallError, "fix what the gateway names"),
        grpc.StatusCode.UNAVAILABLE: (GatewayUnavailableError,
                                      f"is levers9 running at {address or 'the gateway'}? `levers9 status`"),
        grpc.StatusCode.RESOURCE_EXHAUSTED: (GatewayError, f"messages are limited to {MAX_MESSAGE >> 20} MiB; "
                                                           "pass large data through storage"),
    }
    cls, fix = fixes.get(code, (GatewayError, "see the gateway's log (`levers9 status` shows where it runs)"))
    return cls(f"{what} failed: {name}: {details}: {fix}", name, details)


# ---- unary calls ---------------------------------------------------------------------------------

def describe(ref: pb.FunctionRef, what: str) -> pb.DescribeReply:
    """Describe the function, and refuse a sandbox whose Python is not this one's major.minor."""
    stub, target = connect()
    mine = local_python()
    try:
        reply = stub.Describe(pb.DescribeRequest(function=ref, python=mine), metadata=target.metadata,
                              timeout=60.0)
    except grpc.RpcError as exc:
        error = rpc_error(exc, f"describing {what}", target.address)
        if isinstance(error, FunctionNotFoundError) and not ref.pickled:
            raise _not_deployed(ref, error.details) from None
        raise error from None
    if not reply.exists and not ref.pickled:
        raise _not_deployed(ref, "")
    if reply.python and reply.python != mine:
        raise PythonVersionError(
            f"{what} runs on Python {reply.python} but this is Python {mine}: pickled functions and values only load "
            f"on the same major.minor: use Python {reply.python} locally, or an image whose python3 is {mine}")
    return reply


def _not_deployed(ref: pb.FunctionRef, details: str) -> FunctionNotFoundError:
    said = f" ({details})" if details else ""
    return FunctionNotFoundError(f"no function {ref.name} in app {ref.app}{said}: deploy it with "
                                 "`levers9 deploy FILE`", "NOT_FOUND", details)


def end_session(session_id: str) -> bool:
    stub, target = connect()
    try:
        reply = stub.EndSession(pb.EndSessionRequest(session_id=session_id), metadata=target.metadata, timeout=30.0)
    except grpc.RpcError as exc:
        raise rpc_error(exc, f"ending session {session_id}", target.address) from None
    return bool(reply.ended)


# ---- large values over HTTP ----------------------------------------------------------------------

def put_blob(url: str, data: bytes, what: str) -> None:
    request = urllib.request.Request(url, data=data, method="PUT",
                                     headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as r:
            r.read()
    except (OSError, ValueError) as exc:
        raise FunctionError(f"uploading {what} ({len(data) / (1 << 20):.1f} MiB) failed: {exc}: is the "
                            "platform's storage reachable from here?") from None


def get_blob(url: str, what: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as r:
            return bytes(r.read())
    except (OSError, ValueError) as exc:
        raise FunctionError(f"downloading {what} failed: {exc}: is the platform's storage reachable from "
                            "here?") from None
