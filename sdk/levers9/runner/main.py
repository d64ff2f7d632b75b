"""The runner's process: listen at once, load the app in the background, serve until SIGTERM (or a
failed start), then finish the requests in flight."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time

from levers9.executor.server import ExecutorServer
from levers9.runner.config import EXIT_FAILED, EXIT_USAGE, FAILED_EXIT_DELAY, STOP_GRACE_SECONDS, Config
from levers9.runner.runtime import Runtime, log
from levers9.runner.server import Server


def main() -> int:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            try:
                stream.reconfigure(line_buffering=True)  # the user's print() reaches the log at once
            except ValueError:  # detached
                pass
    try:
        config = Config.from_env(dict(os.environ))
    except ValueError as exc:
        print(f"levers9 runner: {exc}", file=sys.stderr)
        return EXIT_USAGE
    runtime = Runtime(config)
    try:
        executor = start_executor(config, runtime)  # before loading: its hooks must see the app's imports
    except OSError as exc:
        print(f"levers9 runner: the executor cannot listen on {config.executor_socket}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    server = Server(config, runtime)  # listening from here on
    accept = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="levers9-accept",
                              daemon=True)
    accept.start()
    signal.signal(signal.SIGTERM, lambda *_: runtime.request_stop())
    signal.signal(signal.SIGINT, lambda *_: runtime.request_stop())
    loading = f"{config.module}.{config.handler}" if config.handler else (config.module or "no module")
    log(f"levers9 runner listening on {config.host}:{server.server_port}; loading {loading} "
        f"({config.kind}, concurrency {config.concurrency})")
    loader = threading.Thread(target=runtime.load, name="levers9-load", daemon=True)
    loader.start()
    while not runtime.finished.wait(0.5):
        pass
    if runtime.state == "failed":
        time.sleep(FAILED_EXIT_DELAY)  # let the worker read the failed health answer
        log(f"exiting with status {EXIT_FAILED}: the app failed to start: {runtime.error}")
        return EXIT_FAILED
    stop(server, runtime, executor)
    return 0


def start_executor(config: Config, runtime: Runtime) -> ExecutorServer | None:
    """A function sandbox's executor, listening on its unix socket (kind function only)."""
    if config.kind != "function":
        return None
    executor = ExecutorServer(config.executor_socket, config.packages_dir, runtime, default_timeout=config.timeout)
    executor.listen()
    threading.Thread(target=executor.serve_forever, name="levers9-executor", daemon=True).start()
    return executor


def stop(server: Server, runtime: Runtime, executor: ExecutorServer | None = None) -> None:
    """Stop accepting, then wait (up to STOP_GRACE_SECONDS) for the requests in flight to finish."""
    log("stopping: no new requests; finishing the ones in flight")
    if executor is not None:
        executor.stop()
    server.shutdown()
    server.server_close()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    idle_checks = 0
    while time.monotonic() < deadline and idle_checks < 2:  # idle twice: none was half accepted
        idle_checks = idle_checks + 1 if runtime.status()["inflight"] == 0 else 0
        time.sleep(0.05)
    left = runtime.status()["inflight"]
    log("stopped" if not left else f"stopped with {left} requests unfinished after {STOP_GRACE_SECONDS:g} s")


def run() -> None:
    """`python3 -m levers9.runner`: main(), then exit without waiting for daemon threads, which may be
    inside user code."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
