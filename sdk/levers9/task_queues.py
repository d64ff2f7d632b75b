"""Task queues and schedules in the SDK: `@app.task_queue(...)`, `@app.schedule(cron, ...)`,
`TaskQueue.put(...)`, `TaskQueue.put_many(iterable, ...)` and `TaskHandle.result(timeout)`.

A task queue is a deployed function whose calls are tasks: `put` appends one to the log through
`POST /taskqueue/NAME` and returns its id at once; the platform runs it at least once (a task whose
sandbox or gateway dies is run again) and records exactly one outcome. Arguments and the result are
JSON, as for `POST /function/APP/NAME`. A schedule is a deployed function run on a cron in a time
zone, each run a task.

Standard library only at import (a container imports the user's file, which imports this): the
REST client (httpx) is imported when a task is put or waited for, on the caller's machine.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any, Callable, Iterator

from levers9.options import ConfigError

QUEUE_OPTIONS = ("retries", "retry_backoff", "ttl", "tasks_per_container", "callback_url")
ENDED = ("succeeded", "failed", "expired", "cancelled")
POLL_S = (0.05, 0.1, 0.2, 0.5, 1.0)
BATCH = 500  # tasks per request of put_many (the gateway takes up to 1,000)


class TaskApiError(Exception):
    """The gateway refused or could not be reached: the message says what failed and why."""

    def __init__(self, message: str, status: int | None = None, body: Any = None):
        super().__init__(message)
        self.status = status
        self.body = body  # the gateway's JSON answer, when it sent one
        self.enqueued: list[TaskHandle] = []  # put_many: the tasks that were enqueued before it failed


class _Api:
    """The few gateway calls of tasks, with the profile `levers9 up` wrote. Not levers9.client: that
    imports levers9.app, which imports this module."""

    def __init__(self) -> None:
        import httpx

        from levers9.runtime.config import Settings

        s = Settings.load()
        if not s.client.gateway_url:
            raise TaskApiError("no gateway is known: run `levers9 up`, or set LEVERS9_GATEWAY_URL")
        headers = {"Authorization": f"Bearer {s.client.token}"} if s.client.token else {}
        self.http = httpx.Client(base_url=s.client.gateway_url.rstrip("/"), headers=headers, timeout=60)

    def call(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        import httpx

        try:
            r = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise TaskApiError(f"{what} failed: {type(exc).__name__}: {exc}: is levers9 running? `levers9 status`") \
                from None
        if r.status_code >= 400:
            try:
                body = r.json()
                detail = body.get("detail", "")
            except (ValueError, AttributeError):
                body, detail = None, r.text[:200]
            raise TaskApiError(f"{what} failed: the gateway answered {r.status_code}: {detail}", r.status_code, body)
        return r.json()


class TaskError(Exception):
    """A task ended without a result (failed, expired, cancelled): `status`, `reason`, `traceback`."""

    def __init__(self, task_id: str, status: str, reason: str = "", error_type: str = "", traceback: str = ""):
        what = f"{error_type}: {reason}" if error_type else reason
        super().__init__(f"task {task_id} {status}" + (f": {what}" if what else ""))
        self.task_id, self.status, self.reason, self.error_type, self.traceback = (
            task_id, status, reason, error_type, traceback)


def _number(value: Any, option: str, low: float, high: float, example: str, whole: bool = False) -> Any:
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        kind = "a whole number" if whole else "a number"
        raise ConfigError(f"{option} {value!r} is not valid: use {kind} from {low:g} to {high:g}, e.g. {example}")
    return value


def queue_options(retries: Any = 0, retry_backoff: Any = 1.0, ttl: Any = 3600.0, tasks_per_container: Any = 1,
                  callback_url: Any = "") -> dict[str, Any]:
    """The spec's `task_queue` section (levers9.contracts.task_spec.TaskQueueOptions), checked."""
    opts = {"retries": _number(retries, "retries", 0, 10, "retries=3", whole=True),
            "retry_backoff": _number(retry_backoff, "retry_backoff", 0, 3600, "retry_backoff=2 (seconds)"),
            "ttl": _number(ttl, "ttl", 1, 7 * 86_400, "ttl=600 (seconds a task may wait)"),
            "tasks_per_container": _number(tasks_per_container, "tasks_per_container", 1, 10_000,
                                           "tasks_per_container=10", whole=True)}
    if callback_url:
        if not isinstance(callback_url, str) or not callback_url.startswith(("http://", "https://")):
            raise ConfigError(f"callback_url {callback_url!r} is not valid: use an http(s) URL that takes a POST")
        opts["callback_url"] = callback_url
    return opts


def schedule_options(cron: Any, timezone: Any, catch_up: Any) -> dict[str, Any]:
    """The spec's `schedule` section, checked here as far as the standard library can (the gateway
    checks the expression fully at deploy, naming the field)."""
    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise ConfigError(f"cron {cron!r} is not valid: use five fields (minute hour day month weekday), "
                          "e.g. '*/5 * * * *'")
    # imported here, not with the module: zoneinfo reads sysconfig at import, which an app without a
    # schedule should not pay for (nor depend on) inside its container (test_sdk_functions)
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ConfigError(f"timezone {timezone!r} is not valid: use a tz database name, e.g. 'Europe/Berlin' or "
                          "'UTC'") from None
    try:  # where cronsim is installed (the caller's machine, not a bare container), the whole expression
        from cronsim import CronSim, CronSimError
    except ImportError:
        pass
    else:
        import datetime

        try:
            CronSim(cron, datetime.datetime(2026, 1, 1, tzinfo=ZoneInfo(timezone)))
        except (CronSimError, ValueError) as exc:
            raise ConfigError(f"cron {cron!r} is not valid: {exc}; e.g. '*/5 * * * *'") from None
    if not isinstance(catch_up, bool):
        raise ConfigError(f"catch_up {catch_up!r} is not valid: use True (a missed tick runs once) or False (skip it)")
    return {"cron": cron, "timezone": timezone, "catch_up": catch_up}


class TaskHandle(str):
    """A task's id (it is the string) with a way to wait for its outcome."""
    _client: _Api | None

    def __new__(cls, task_id: str, client: _Api | None = None) -> TaskHandle:
        handle = super().__new__(cls, task_id)
        handle._client = client
        return handle

    @property
    def task_id(self) -> str:
        return str(self)

    def _api(self) -> _Api:
        if self._client is None:
            self._client = _Api()
        return self._client

    def status(self) -> dict[str, Any]:
        """What `GET /api/v1/tasks/ID` says: status, attempt, result or error, output."""
        return self._api().call("GET", f"/api/v1/tasks/{self}", f"reading task {self}")

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the task's outcome: its result, or TaskError (failed, expired, cancelled); TimeoutError
        when it has not ended within `timeout` seconds (the task goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        n = 0
        while True:
            found = self.status()
            if found["status"] in ENDED:
                if found["status"] == "succeeded":
                    return found.get("result")
                error = found.get("error") or {}
                raise TaskError(self, found["status"], error.get("reason", ""), error.get("type", ""),
                                error.get("traceback", ""))
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {self} is still {found['status']} after {timeout:g} s")
            pause = POLL_S[min(n, len(POLL_S) - 1)]
            time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
            n += 1

    def cancel(self) -> dict[str, Any]:
        return self._api().call("POST", f"/api/v1/tasks/{self}/cancel", f"cancelling task {self}")


class TaskQueue:
    """A function of an App whose calls are tasks: call it to run it here, `.put(...)` to enqueue it."""

    def __init__(self, local: Callable[..., Any], app_name: str, name: str):
        self.local, self.app_name, self.name = local, app_name, name
        functools.update_wrapper(self, local)  # the sandbox runs what __wrapped__ is

    def __repr__(self) -> str:
        return f"TaskQueue({self.app_name!r}, {self.name!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.local(*args, **kwargs)

    def put(self, *args: Any, **kwargs: Any) -> TaskHandle:
        """Enqueue one task with these (JSON) arguments; returns its handle (the task id) at once."""
        try:
            body = json.dumps({"args": list(args), "kwargs": kwargs})
        except (TypeError, ValueError) as exc:
            raise TypeError(f"a task's arguments travel as JSON: {exc}") from None
        api = _Api()
        answer = api.call("POST", f"/taskqueue/{self.name}", f"putting a task on {self.name!r} (deployed? "
                          "`levers9 deployments list`)", content=body, headers={"Content-Type": "application/json"})
        return TaskHandle(answer["task_id"], api)

    def put_many(self, *iterables: Any, **kwargs: Any) -> list[TaskHandle]:
        """Enqueue one task per element, like `map`: `q.put_many(range(100))` puts q(0) ... q(99); several
        iterables are zipped into positional arguments; the keyword arguments are the same for every
        task. Sent BATCH tasks per request (`POST /taskqueue/NAME/batch`); returns the handles in order.
        On a failure, TaskApiError's `enqueued` holds the handles of the tasks that were enqueued."""
        api: _Api | None = None
        handles: list[TaskHandle] = []
        for chunk in task_batches(iterables, kwargs, BATCH):  # read now: a caller may set BATCH
            api = api or _Api()
            try:
                answer = api.call("POST", f"/taskqueue/{self.name}/batch", f"putting {len(chunk)} tasks on "
                                  f"{self.name!r} (deployed? `levers9 deployments list`)", content=chunk,
                                  headers={"Content-Type": "application/json"})
            except TaskApiError as exc:
                done = exc.body.get("task_ids", []) if isinstance(exc.body, dict) else []
                exc.enqueued = handles + [TaskHandle(t, api) for t in done]
                raise
            handles += [TaskHandle(t, api) for t in answer["task_ids"]]
        return handles


def task_batches(iterables: tuple[Any, ...], kwargs: dict[str, Any], size: int = BATCH) -> Iterator[str]:
    """The JSON bodies of put_many: arrays of at most `size` tasks, each `{"args": [...], "kwargs": {...}}`."""
    if not iterables:
        raise TypeError("put_many takes at least one iterable of arguments, e.g. q.put_many(range(10))")
    try:
        same = json.dumps(kwargs)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a task's arguments travel as JSON: {exc}") from None
    chunk: list[str] = []
    for args in zip(*iterables, strict=False):  # like map: as many tasks as the shortest has
        try:
            chunk.append(f'{{"args": {json.dumps(list(args))}, "kwargs": {same}}}')
        except (TypeError, ValueError) as exc:
            raise TypeError(f"a task's arguments travel as JSON: {exc}") from None
        if len(chunk) == size:
            yield "[" + ", ".join(chunk) + "]"
            chunk = []
    if chunk:
        yield "[" + ", ".join(chunk) + "]"


class Scheduled:
    """A function of an App run on a cron; calling it runs it here."""

    def __init__(self, local: Callable[..., Any], app_name: str, name: str, schedule: dict[str, Any]):
        self.local, self.app_name, self.name, self.schedule = local, app_name, name, schedule
        functools.update_wrapper(self, local)

    def __repr__(self) -> str:
        return f"Scheduled({self.app_name!r}, {self.name!r}, {self.schedule['cron']!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.local(*args, **kwargs)


def register_task_queue(app: Any, func: Any, options: dict[str, Any]) -> Any:
    """@app.task_queue: a deployed function (code kind "function") with a task_queue section."""
    queue = queue_options(**{k: options.pop(k) for k in QUEUE_OPTIONS if k in options})
    _refuse(options, "task_queue")

    def register(obj: Any) -> Any:
        registration = app._register("function", obj, function={"retries": 0}, **options)
        registration.spec["task_queue"] = queue
        registration.obj = TaskQueue(obj, app.name, registration.spec["name"])
        return registration.obj

    return register(func) if func is not None else register


def register_schedule(app: Any, cron: Any, timezone: Any, catch_up: Any, options: dict[str, Any]) -> Any:
    """@app.schedule(cron): a deployed function with a schedule section (and the queue options of its runs)."""
    schedule = schedule_options(cron, timezone, catch_up)
    queue = queue_options(**{k: options.pop(k) for k in QUEUE_OPTIONS if k in options})
    _refuse(options, "schedule")

    def register(obj: Any) -> Any:
        registration = app._register("function", obj, function={"retries": 0}, **options)
        registration.spec["schedule"] = schedule
        registration.spec["task_queue"] = queue
        registration.obj = Scheduled(obj, app.name, registration.spec["name"], schedule)
        return registration.obj

    return register


def _refuse(options: dict[str, Any], what: str) -> None:
    if "on_start" in options:
        raise ConfigError(f"@app.{what} takes no on_start: load what the function needs at the top of its module")
