"""A call's connection ends with its result. The executor's watcher reads the connection for a cancel
while the call runs; it is woken the moment the call is done. It used to finish only at its poll's
next timeout (POLL_S, 0.1 s), and the connection stayed open until then: every call held its
executor connection, and with it the worker relay's connection from the gateway (given back only on
the relay's `relay-next`), 0.1 s after its result, so most calls opened a new one."""

from __future__ import annotations

import socket
import threading

import cloudpickle

from levers9.executor import calls, server, wire


class ReadyHost:
    """The runner's side as the executor sees it: loaded, one slot."""

    def __init__(self) -> None:
        self.slots = threading.BoundedSemaphore(1)
        self.loaded = threading.Event()
        self.loaded.set()
        self.state, self.error = "ready", ""
        self.inflight = 0

    def begin(self) -> None:
        self.inflight += 1

    def end(self) -> None:
        self.inflight -= 1

    def status(self) -> dict:
        return {"state": self.state, "inflight": self.inflight}


def test_a_call_ends_as_soon_as_its_result_is_sent(monkeypatch, tmp_path):
    monkeypatch.setattr(server, "POLL_S", 60.0)  # the watcher's poll would wait a minute unless woken
    executor = server.ExecutorServer(str(tmp_path / "executor.sock"), str(tmp_path / "packages"), ReadyHost())
    fn = cloudpickle.dumps(lambda x: x + 1)
    request = calls.CallRequest.from_header({"kind": "call", "call_id": "c1", "function": {"pickled": len(fn)}})
    caller, theirs = socket.socketpair()
    with caller, theirs:
        call = threading.Thread(target=executor._call, args=(theirs, request, fn + cloudpickle.dumps(((41,), {}))),
                                daemon=True)
        call.start()
        header, body = wire.read_frame(caller)
        assert header["kind"] == "result" and header["ok"] and cloudpickle.loads(body) == 42
        call.join(timeout=20)  # a ceiling far below the watcher's minute, far above a loaded machine's delay
        assert not call.is_alive(), "the call's thread still waits for its watcher after the result went out"
