"""How the gateway reaches a function sandbox's executor: through this worker.

The executor listens on a unix socket inside its sandbox (levers9.executor.wire); its directory is
a bind of a host directory, so the worker can connect to it. The relay is one TCP listener per
worker: the gateway opens a connection, sends one line of JSON `{"container_id", "key"}`, and from
then on the bytes are spliced both ways between that connection and a new connection to the
sandbox's socket (the executor's hello comes first). A refusal is one wire frame
`{"kind": "error", "error": "..."}` and the connection closes.

A line with `"keep": true` keeps the gateway's connection for the next call: once the executor has
closed its side (a call is one executor connection), the relay sends `{"kind": "relay-next"}` and
reads the next line. The gateway sends that line only after the marker, so no byte of the next call
is read by the previous splice. Why: a new TCP connection per call cost both processes an accept, a
transport and a close on every task. A line without `keep` (a gateway of before) is served as one.

The key is an HMAC of the container id under a secret this worker process draws at start, so a
relay address (wire.relay_address, published in ContainerReady) opens that
sandbox only, and none after the worker restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import shutil
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from levers9.executor import wire
from levers9.worker.lifecycle.sdk_mount import precompiled

log = logging.getLogger("levers9.worker.sandboxes.executor_relay")

HEADER_LIMIT = 4096
QUIET_TIMEOUT_S = 60.0
HELLO_TIMEOUT_S = 5.0
KEPT_IDLE_S = 120.0  # a kept connection with no next line: closed (the gateway's pool drops its own sooner)
NEXT = wire.encode({"kind": "relay-next"})


class Relay:
    """The worker's relay. `socket_of(container_id)` is the executor socket of a ready function
    sandbox of this worker, or None."""

    def __init__(self, socket_of: Callable[[str], Path | None]) -> None:
        self.socket_of = socket_of
        self.secret = secrets.token_bytes(32)
        self.connections = 0
        self.open: dict[str, int] = {}  # container id -> connections spliced to its executor now
        self.paused: dict[str, asyncio.Event] = {}  # containers being dumped: set when they may go on

    @contextlib.asynccontextmanager
    async def quiet(self, container_id: str, timeout: float = QUIET_TIMEOUT_S) -> AsyncIterator[None]:
        """No connection to this sandbox's executor while the block runs (a CRIU dump cannot take a
        unix socket whose peer is outside the container): new ones wait, open ones are waited for."""
        resume = self.paused[container_id] = asyncio.Event()
        try:
            deadline = asyncio.get_running_loop().time() + timeout
            while self.open.get(container_id) and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
            if self.open.get(container_id):
                raise RuntimeError(f"calls to {container_id} did not end within {timeout:g} s")
            yield
        finally:
            del self.paused[container_id]
            resume.set()

    def key(self, container_id: str) -> str:
        return hmac.new(self.secret, container_id.encode(), hashlib.sha256).hexdigest()[:32]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            wait_s = HELLO_TIMEOUT_S
            while (line := await asyncio.wait_for(reader.readline(), wait_s)) and await self._one(line, reader, writer):
                writer.write(NEXT)
                await writer.drain()
                wait_s = KEPT_IDLE_S
        except (asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # the worker stopping: a kept connection idles here; end quietly
            pass                        # (asyncio logs a handler task that ends cancelled as an error)
        finally:
            self.connections -= 1
            writer.close()

    async def _one(self, line: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One call: `line` names the sandbox. True when the connection may take the next call."""
        sock, refusal = self._target(line)
        if sock is None:
            writer.write(wire.encode({"kind": "error", "error": refusal}))
            await writer.drain()
            return False
        ask = json.loads(line)
        container_id, keep = ask["container_id"], ask.get("keep") is True
        while container_id in self.paused:  # being dumped: wait for it
            await self.paused[container_id].wait()
        self.open[container_id] = self.open.get(container_id, 0) + 1
        try:
            up_reader, up_writer = await open_socket(sock, limit=1 << 20)
        except OSError as exc:
            writer.write(wire.encode({"kind": "error", "error": f"the sandbox's executor does not answer: {exc}"}))
            await writer.drain()
            return False
        else:
            executor_ended = await splice(reader, writer, up_reader, up_writer)
        finally:
            self.open[container_id] -= 1
        return keep and executor_ended and not reader.at_eof()

    def _target(self, line: bytes) -> tuple[Path | None, str]:
        try:
            ask = json.loads(line)
            container_id, key = str(ask["container_id"]), str(ask["key"])
        except (ValueError, KeyError, TypeError):
            return None, "the relay expects one line of JSON with container_id and key"
        if not hmac.compare_digest(key, self.key(container_id)):
            return None, f"wrong key for container {container_id}"
        sock = self.socket_of(container_id)
        if sock is None:
            return None, f"container {container_id} is not a ready function sandbox of this worker"
        return sock, ""


async def splice(a_reader: asyncio.StreamReader, a_writer: asyncio.StreamWriter,
                 b_reader: asyncio.StreamReader, b_writer: asyncio.StreamWriter) -> bool:
    """Copy both ways until either side closes; then close b (the caller closes a). True when b (the
    executor) ended first: with `keep`, a may then carry the next call."""
    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(1 << 16):
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass

    upstream = asyncio.create_task(pump(b_reader, a_writer))
    tasks = [asyncio.create_task(pump(a_reader, b_writer)), upstream]
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    b_writer.close()
    return upstream in done and b_reader.at_eof()

async def open_socket(sock: Path, **kw: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the socket at `sock` itself, never to what a link there points at: its directory is
    the sandbox's own (bound at /run/levers9), and a link it planted to a socket of the host (the
    database's, say) would have this root process connect there for it. OSError if it is no socket."""
    fd = os.open(sock, os.O_PATH | os.O_NOFOLLOW)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise ConnectionRefusedError(f"{sock.name} in the sandbox's directory is not a socket")
        return await asyncio.open_unix_connection(f"/proc/self/fd/{fd}", **kw)
    finally:
        os.close(fd)


async def executor_hello(sock: Path) -> dict:
    """Connect to a sandbox's executor and read its hello; ProtocolError if its generation is unknown."""
    reader, writer = await open_socket(sock)
    try:
        header, _ = await asyncio.wait_for(wire.aread_frame(reader), HELLO_TIMEOUT_S)
        wire.check_hello(header)
        return header
    finally:
        writer.close()


def vendor_dir(home: Path) -> Path:
    """A directory holding a copy of this platform's cloudpickle, which sandboxes import beside the
    SDK (a bind of the venv's site-packages would show sandboxes every package of the host)."""
    import cloudpickle

    target = home / "vendor" / f"cloudpickle-{cloudpickle.__version__}"
    if not (target / "cloudpickle" / "__init__.py").exists():
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(Path(cloudpickle.__file__).parent, tmp / "cloudpickle",
                        ignore=shutil.ignore_patterns("__pycache__"))
        tmp.chmod(0o755)
        precompiled(tmp)  # the mount is read-only: Python could write no bytecode there
        try:
            tmp.rename(target)
        except OSError:  # another worker of this machine made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return target
