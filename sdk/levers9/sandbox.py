"""Sandboxes: a container you drive from outside (REST underneath: /api/v1/sandboxes, see the
gateway's routes_sandboxes for other languages).

    sb = Sandbox.create(app="demo", image=Image(python_packages=["numpy"]), cpu=0.5, memory="512Mi",
                        timeout=600, idle_timeout=120, workdir="/sandbox", env={"MODE": "test"})
    p = sb.exec("python3", "-c", "print(input())")
    p.stdin.write("hello\\n"); p.stdin.close()
    for line in p.stdout: print(line, end="")      # lines as the program writes them
    p.wait()                                       # its exit code (127: no such program)
    sb.files.write("data/x.txt", b"..."); sb.files.read("data/x.txt"); sb.files.ls("data"); sb.files.rm("data/x.txt")
    snap = sb.snapshot()                           # memory and files; Sandbox.create(from_snapshot=snap)
    sb.terminate()

Standard library at import (levers9's client, httpx, is imported when a sandbox is first used).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from levers9.options import Image, parse_cpu, parse_memory

STREAM_TIMEOUT = {"connect": 10.0, "read": None, "write": 60.0, "pool": 10.0}
CREATE_TIMEOUT_S = 600.0


class SandboxError(Exception):
    """A sandbox request the gateway refused (`status`: its HTTP status), with its sentence."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _client(client: Any = None) -> Any:
    if client is not None:
        return client
    from levers9.client import Client

    return Client.from_profile()


def _call(client: Any, method: str, path: str, what: str, **kw: Any) -> Any:
    from levers9.client import ClientError

    try:
        return client._call(method, path, what, see="levers9 sandboxes list", **kw)
    except ClientError as exc:
        raise SandboxError(str(exc), exc.status) from None


class Sandbox:
    def __init__(self, sandbox_id: str, client: Any = None, info: Mapping[str, Any] | None = None) -> None:
        self.id = sandbox_id
        self.client = _client(client)
        self.info = dict(info or {})
        self.files = Files(self)

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r})"

    @property
    def path(self) -> str:
        return f"/api/v1/sandboxes/{self.id}"

    @classmethod
    def create(cls, *, app: Any = "sandboxes", image: Image | None = None, cpu: Any = 1, memory: Any = "1Gi",
               timeout: int = 3600, idle_timeout: int = 600, workdir: str = "/sandbox",
               env: Mapping[str, str] | None = None, secrets: list[str] | None = None, pool: str = "default",
               from_snapshot: Any = None, client: Any = None) -> Sandbox:
        """A running sandbox (this returns once its agent answers). `from_snapshot`: a snapshot id (or
        what `snapshot()` returned) to restore, memory and files; its own options are the snapshot's."""
        body: dict[str, Any] = {"app": getattr(app, "name", app), "cpu_millicores": parse_cpu(cpu),
                                "memory_mib": parse_memory(memory), "timeout": int(timeout),
                                "idle_timeout": int(idle_timeout), "workdir": workdir, "env": dict(env or {}),
                                "secrets": list(secrets or []), "pool": pool}
        if image is not None:
            body["image"] = image.to_dict()
        if from_snapshot:
            body = {"from_snapshot": str(getattr(from_snapshot, "id", from_snapshot))}
        c = _client(client)
        info = _call(c, "POST", "/api/v1/sandboxes", "creating a sandbox", json=body, timeout=CREATE_TIMEOUT_S)
        return cls(info["sandbox_id"], c, info)

    @classmethod
    def from_id(cls, sandbox_id: str, client: Any = None) -> Sandbox:
        return cls(sandbox_id, client)

    @staticmethod
    def list(client: Any = None, all: bool = False) -> list[dict[str, Any]]:
        return _call(_client(client), "GET", "/api/v1/sandboxes", "listing sandboxes", params={"all": all})

    def status(self) -> dict[str, Any]:
        return _call(self.client, "GET", self.path, f"reading sandbox {self.id}")

    def exec(self, *argv: str, env: Mapping[str, str] | None = None, workdir: str | None = None,
             timeout: float | None = None) -> Process:
        """Start a program in the sandbox; its output streams into the returned Process at once.
        `timeout`: seconds after which the program and what it started are killed (exit code 124,
        `Process.timed_out`); none by default: it runs as long as the sandbox."""
        return Process(self, [str(a) for a in argv], dict(env or {}), workdir, timeout)

    def snapshot(self) -> Snapshot:
        info = _call(self.client, "POST", f"{self.path}/snapshot", f"snapshotting sandbox {self.id}",
                     timeout=CREATE_TIMEOUT_S)
        return Snapshot(info["snapshot_id"], info)

    def terminate(self) -> None:
        _call(self.client, "DELETE", self.path, f"terminating sandbox {self.id}")

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()


class Snapshot(str):
    """A snapshot's id (a checkpoint of the sandbox's memory and files); `.info` says its size."""

    def __new__(cls, snapshot_id: str, info: Mapping[str, Any] | None = None) -> Snapshot:
        obj = super().__new__(cls, snapshot_id)
        obj.info = dict(info or {})  # type: ignore[attr-defined]
        return obj

    @property
    def id(self) -> str:
        return str(self)


class Files:
    """The sandbox's files, under its workdir (a path that leaves it is refused: 403)."""

    def __init__(self, sb: Sandbox) -> None:
        self.sb = sb

    def write(self, path: str, data: bytes | str) -> int:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        return _call(self.sb.client, "PUT", f"{self.sb.path}/files", f"writing {path}", params={"path": path},
                     content=raw, headers={"Content-Type": "application/octet-stream"})["size"]

    def read(self, path: str) -> bytes:
        from levers9.client import ClientError

        try:
            r = self.sb.client._http.get(f"{self.sb.path}/files", params={"path": path})
        except Exception as exc:  # noqa: BLE001 - the transport's error, said as the client says it
            raise SandboxError(f"reading {path} failed: {exc}") from None
        if r.status_code >= 400:
            err: ClientError = self.sb.client._status_error(r, f"reading {path}", "levers9 sandboxes list")
            raise SandboxError(str(err), r.status_code)
        return r.content

    def ls(self, path: str = ".") -> list[dict[str, Any]]:
        return _call(self.sb.client, "GET", f"{self.sb.path}/ls", f"listing {path}", params={"path": path})["entries"]

    def rm(self, path: str, recursive: bool = False) -> None:
        _call(self.sb.client, "DELETE", f"{self.sb.path}/files", f"removing {path}",
              params={"path": path, "recursive": recursive})


class Stream:
    """One of a program's outputs: iterate its lines as they come, or `read()` it all."""

    def __init__(self) -> None:
        self.buffer = ""
        self.ended = False
        self.changed = threading.Condition()

    def feed(self, text: str) -> None:
        with self.changed:
            self.buffer += text
            self.changed.notify_all()

    def end(self) -> None:
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def __iter__(self) -> Iterator[str]:
        while True:
            with self.changed:
                self.changed.wait_for(lambda: "\n" in self.buffer or self.ended)
                if "\n" in self.buffer:
                    line, _, self.buffer = self.buffer.partition("\n")
                    out = line + "\n"
                elif self.buffer:
                    out, self.buffer = self.buffer, ""
                else:
                    return
            yield out

    def read(self) -> str:
        with self.changed:
            self.changed.wait_for(lambda: self.ended)
            out, self.buffer = self.buffer, ""
        return out


class Stdin:
    def __init__(self, process: Process) -> None:
        self.process = process

    def write(self, data: bytes | str) -> None:
        self._send(data.encode() if isinstance(data, str) else bytes(data), close=False)

    def close(self) -> None:
        self._send(b"", close=True)

    def drain(self) -> None:
        """Nothing to do: each write is sent at once."""

    def _send(self, data: bytes, close: bool) -> None:
        p = self.process
        exec_id = p.exec_id()
        _call(p.sb.client, "POST", f"{p.sb.path}/exec/{exec_id}/stdin", "writing to the program's stdin",
              params={"close": close}, content=data, headers={"Content-Type": "application/octet-stream"})


class Process:
    """A program running in a sandbox: `stdout`/`stderr` stream, `stdin` writes, `wait()` its exit code."""

    def __init__(self, sb: Sandbox, argv: list[str], env: dict[str, str], workdir: str | None,
                 timeout: float | None = None) -> None:
        self.sb, self.argv = sb, argv
        self.stdout, self.stderr, self.stdin = Stream(), Stream(), Stdin(self)
        self.returncode: int | None = None
        self.timed_out = False
        self.pid = 0
        self._id = ""
        self._started = threading.Event()
        self._done = threading.Event()
        self._error: SandboxError | None = None
        body = {"argv": argv, "env": env, **({"workdir": workdir} if workdir else {}),
                **({"timeout": timeout} if timeout is not None else {})}
        self._thread = threading.Thread(target=self._read, args=(body,), daemon=True, name="levers9-exec")
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def exec_id(self) -> str:
        if not self._id:
            raise SandboxError(f"{self.argv[0]} did not start: it has no stdin")
        return self._id

    def _read(self, body: dict[str, Any]) -> None:
        import httpx

        try:
            with self.sb.client._http.stream("POST", f"{self.sb.path}/exec", json=body,
                                             timeout=httpx.Timeout(**STREAM_TIMEOUT)) as r:
                if r.status_code >= 400:
                    r.read()
                    self._error = SandboxError(str(self.sb.client._status_error(r, "exec", "levers9 sandboxes list")),
                                               r.status_code)
                    return
                for raw in r.iter_lines():
                    if raw:
                        self._frame(json.loads(raw))
        except httpx.HTTPError as exc:
            self._error = self._error or SandboxError(f"exec of {self.argv[0]} lost its stream: {exc}")
        finally:
            self.stdout.end()
            self.stderr.end()
            self._started.set()
            self._done.set()

    def _frame(self, doc: dict[str, Any]) -> None:
        if "exec_id" in doc:
            self._id, self.pid = doc["exec_id"], doc.get("pid", 0)
            self._started.set()
        elif "data" in doc:
            (self.stderr if doc.get("fd") == 2 else self.stdout).feed(doc["data"])
        elif "exit_code" in doc:
            if doc.get("error"):
                self._error = SandboxError(doc["error"])
            self.returncode = doc["exit_code"]
            self.timed_out = bool(doc.get("timed_out"))

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (as a shell's: 127 no such program, 128+N killed by signal N)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.argv[0]} still runs after {timeout} s")
        if self.returncode is None:
            raise self._error or SandboxError(f"exec of {self.argv[0]} ended without an exit code")
        return self.returncode
