"""The SDK: `App`, its `@app.endpoint`, `@app.asgi`, `@app.realtime` and `@app.function` decorators, `Image`,
`Secret`, and `load_app_file`, which reads the specs the gateway receives out of a user's .py file.

A spec is plain JSON of `levers9.contracts.spec.DeploymentSpec` (code, resources in millicores and
MiB, scaling, ...) holding the options that were passed; the gateway decodes it and fills in the
Struct's defaults.

Standard library only: inside a container this package is mounted alone on a bare python3, and the
user's file imports it (`from levers9 import App`) before the runner can serve anything.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import os
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from levers9.options import (
    UNSET,
    ConfigError,
    Image,
    Secret,
    check_name,
    drop_unset,
    env_vars,
    given,
    on_start_name,
    parse_cpu,
    parse_gpu,
    parse_memory,
    resources,
    secret_names,
    whole,
)
from levers9.scaling_options import scaling
from levers9.volumes import CloudBucket, Volume, split_mounts

# scaling options beyond the four every registration names (levers9.scaling_options)
SCALING_OPTIONS = {"buffer_containers", "target_concurrency", "scaledown_window", "warm_schedule",
                   "warm_schedule_timezone", "max_pending"}

__all__ = ["App", "CloudBucket", "ConfigError", "Image", "Secret", "Volume", "load_app_file", "parse_cpu", "parse_memory", "parse_gpu"]

# the top-level keys of DeploymentSpec, the ones a spec may have (image_ref is the gateway's: the SDK
# never sends it)
SPEC_KEYS = ("name", "app_name", "code", "image", "image_ref", "resources", "scaling", "timeout_seconds", "secrets",
             "env", "checkpoint_enabled", "pool", "function", "volumes", "buckets", "task_queue", "schedule", "box",
             "sandbox")

# ---- App -----------------------------------------------------------------------------------------

@dataclass
class _Registration:
    obj: Any  # the decorated function, or the ASGI app object
    spec: dict[str, Any]
    on_start: Callable[..., Any] | None


def _module_name(obj: Any) -> str:
    module = getattr(obj, "__module__", "") or ""
    if module == "__main__":  # `python hello.py`: the container imports it as `hello`
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        return Path(main_file).stem if main_file else ""
    return module


class App:
    """A named group of endpoints deployed together.

        app = App("hello")

        @app.endpoint(cpu=0.5, memory="256Mi")
        def hello(name: str = "world"):
            return {"message": f"hello, {name}"}
    """

    def __init__(self, name: str):
        self.name = check_name(name, "app name")
        self._registrations: list[_Registration] = []

    def __repr__(self) -> str:
        return f"App({self.name!r}, endpoints={[r.spec['name'] for r in self._registrations]})"

    def function(self, func: Callable[..., Any] | None = None, /, *, retries: Any = 0, packages: Any = None,
                 shared_checkpoints: Any = True, preload: Any = None, **options: Any) -> Any:
        """A Python function run in a sandbox: returns a `levers9.Function` (calling it runs it
        here; .remote/.map/.starmap/.spawn/.remote_gen run it remotely); `levers9 deploy` deploys it.

        Options: those of @app.endpoint except on_start, plus retries (attempts after the first,
        0-10), packages (pip requirements installed in the sandbox when the image lacks them) and
        shared_checkpoints (False: never start from the platform's shared pre-import checkpoints) and
        preload (modules imported when the sandbox starts, so a checkpoint of it holds them).
        """
        from levers9.functions import function_options, make_function

        if "on_start" in options:
            raise ConfigError("@app.function takes no on_start: load what the function needs at the top of its "
                              "module, or inside it")

        def register(obj: Any) -> Any:
            generator = inspect.isgeneratorfunction(obj)
            extra = function_options(retries, packages, generator, shared_checkpoints, preload)
            registration = self._register("function", obj, function=extra, **options)
            fn = make_function(obj, self.name, registration.spec)
            registration.obj = fn  # what the module holds: load_app_file finds it by name
            return fn

        return register(func) if func is not None else register

    def task_queue(self, func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """A function whose calls are tasks (levers9.task_queues): `.put(*args, **kwargs)` enqueues one and
        returns its TaskHandle (the task id) at once; `.result(timeout)` waits for it. Options: retries,
        retry_backoff (seconds, doubled per retry), timeout (per attempt), ttl (seconds a task may wait),
        concurrency, max_containers, tasks_per_container, callback_url, and those of @app.function."""
        from levers9.task_queues import register_task_queue

        return register_task_queue(self, func, options)

    def schedule(self, cron: str, *, timezone: str = "UTC", catch_up: bool = True, **options: Any) -> Any:
        """Run a function on a cron ("*/5 * * * *") in a time zone, each run a task; a tick missed while
        the platform was down runs once when it is back (catch_up=False: skipped)."""
        from levers9.task_queues import register_schedule

        return register_schedule(self, cron, timezone, catch_up, options)

    def session(self) -> Any:
        """`with app.session():` the calls of this app's functions in the block share one sandbox
        (one session id); it is ended when the block ends."""
        from levers9.functions import Session

        return Session(self.name)

    def endpoint(self, func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Deploy a function as an HTTP endpoint: the JSON body's fields become its keyword arguments.

        Options: name (default: the function's name, '_' written '-'), cpu (cores), memory (MiB, or
        '512Mi'/'2Gi'), gpu (a type or a list in order of preference), gpu_count, image,
        keep_warm_seconds (or scaledown_window), min_containers, max_containers, buffer_containers,
        concurrency (the hard cap), target_concurrency (what the autoscaler aims for), warm_schedule
        (cron -> minimum, e.g. {"0 8 * * 1-5": 2, "0 19 * * 1-5": 0}) and warm_schedule_timezone, max_pending
        (calls that may wait per gateway; one more gets 429), timeout (seconds), secrets,
        env, on_start (a top-level function; its value is context.on_start_value),
        checkpoint_enabled, pool, volumes (Volume and CloudBucket objects). A mistake raises ConfigError saying how to fix it.
        """
        return self._decorator("endpoint", func, options)

    def box(self, name: str, *, command: Any, port: Any, ready_path: Any = None, idle_checkpoint: Any = False,
            **options: Any) -> None:
        """Deploy any program that listens on a port: `command` (a list: the program and its arguments,
        run as the container's process in `image`, cwd /app holding this file's directory) listening
        on `port`, reached at {gateway}/box/NAME/... (any method, path and query). It is ready once the
        port accepts a connection (or `ready_path` answers 2xx); with checkpoint_enabled it is dumped
        then and the next start restores. Its stdout and stderr are its log. With idle_checkpoint
        (and checkpoint_enabled) it is dumped again when it is stopped for being idle, and the next
        start restores that: its memory comes back as it was left.

            app.box("files", command=["python3", "-m", "http.server", "8000"], port=8000)

        Options: those of @app.endpoint but on_start (image, cpu, memory, gpu, env, secrets, volumes,
        keep_warm_seconds, min_containers, max_containers, concurrency, timeout (also how long its port
        may take to answer), checkpoint_enabled, pool, ...).
        """
        from levers9.box_options import box_section, refuse_runner_options

        refuse_runner_options(options)
        self._register("box", None, name=name, box=box_section(command, port, ready_path, idle_checkpoint),
                       **options)

    def notebook(self, name: str, *, image: Any = None, idle_timeout: Any = 600, **options: Any) -> None:
        """Deploy a notebook: JupyterLab in `image` (None: the platform's base; `jupyterlab` is added),
        opened through the dashboard at {dashboard}/nb/NAME/ with its session. Left idle for
        `idle_timeout` seconds (no request and no open page) it is dumped and stopped; opening it again
        restores it, kernels' variables included. `levers9 notebook NAME` does this without a file.

            app.notebook("analysis", image=Image(python_packages=["pandas==2.2.3"]), gpu="T4")

        Options: cpu, memory (default 1Gi), gpu, gpu_count, env, secrets, volumes, pool, timeout
        (how long JupyterLab may take to answer at its first start).
        """
        from levers9.notebooks import notebook_options

        self._register("box", None, **notebook_options(name, image, idle_timeout, options))

    def asgi(self, func: Any = None, /, **options: Any) -> Any:
        """Deploy an ASGI app: decorate a function returning one, or pass the app object itself."""
        return self._decorator("asgi", func, options)

    def realtime(self, func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Deploy a function that answers WebSocket messages, reached at {gateway}/endpoint/NAME with a
        WebSocket: it is called once per message (text as str, binary as bytes) and what it returns is
        sent back (str as text, bytes as binary, None as nothing, anything else as JSON). It may be
        sync or async; `context` (on_start_value, path, headers) is passed when it has a parameter of
        that name, as in `def handler(context, event)`. Options: those of @app.endpoint.
        """
        return self._decorator("realtime", func, options)

    def _decorator(self, kind: str, func: Any, options: dict[str, Any]) -> Any:
        def register(obj: Any) -> Any:
            self._register(kind, obj, **options)
            return obj  # stays callable locally, unchanged

        return register(func) if func is not None else register

    def _register(self, kind: str, obj: Any, *, name: str | None = None, cpu: Any = UNSET, memory: Any = UNSET,
                  gpu: Any = None, gpu_count: int | None = None, image: Image | None = None,
                  keep_warm_seconds: Any = UNSET, min_containers: Any = UNSET, max_containers: Any = UNSET,
                  concurrency: Any = UNSET, timeout: Any = UNSET, secrets: Any = None, env: Any = None,
                  on_start: Callable[..., Any] | None = None, checkpoint_enabled: Any = UNSET,
                  pool: Any = UNSET, function: Any = UNSET, volumes: Any = None, box: Any = UNSET,
                  **scaling_options: Any) -> _Registration:
        """Check the options and keep the spec: only what was passed (and what the SDK works out),
        so DeploymentSpec's defaults apply to the rest."""
        unknown = set(scaling_options) - SCALING_OPTIONS
        if unknown:
            raise TypeError(f"unexpected keyword argument {sorted(unknown)[0]!r}: see help(app.endpoint)")
        handler, name = self._names(kind, obj, name)
        if image is not None and not isinstance(image, Image):
            raise ConfigError(f"image {image!r} is not valid: use Image(python_packages=[...]) (from levers9 import "
                              "Image) or None")
        if checkpoint_enabled is not UNSET and not isinstance(checkpoint_enabled, bool):
            raise ConfigError(f"checkpoint_enabled {checkpoint_enabled!r} is not valid: use True or False")
        code = {"kind": kind, "module": _module_name(obj) if handler else "", "handler": handler,
                "on_start": on_start_name(on_start) if on_start is not None else UNSET}
        spec = {
            "name": name,
            "app_name": self.name,
            "code": drop_unset(code),
            "image": image.to_dict() if image is not None else UNSET,
            "resources": resources(cpu, memory, gpu, gpu_count),
            "scaling": scaling(keep_warm_seconds, min_containers, max_containers, concurrency, **scaling_options),
            "timeout_seconds": given(timeout, lambda v: whole(v, "timeout", 1, "timeout=180")),
            "secrets": secret_names(secrets) if secrets is not None else UNSET,
            "env": env_vars(env) if env is not None else UNSET,
            "checkpoint_enabled": checkpoint_enabled,
            "pool": given(pool, lambda v: check_name(v, "pool")),
            "function": function,
            "box": box,
        }
        if volumes is not None:  # Volume(...) and CloudBucket(...) objects (levers9.volumes)
            spec["volumes"], spec["buckets"] = split_mounts(volumes)
        registration = _Registration(obj, drop_unset(spec), on_start)
        self._registrations.append(registration)
        return registration

    def _names(self, kind: str, obj: Any, name: str | None) -> tuple[str, str]:
        """(handler, endpoint name): the function's name, and the URL name (say_hello -> say-hello)."""
        if kind == "box":  # a box runs a program, not a function: its name is all it has
            return "", self._unique(check_name(name, "box name"))
        if not callable(obj):
            raise ConfigError(f"@app.{kind} was given {obj!r}, which is not callable: decorate a function"
                              + (" or pass an ASGI app" if kind == "asgi" else ""))
        handler = getattr(obj, "__name__", "") if inspect.isfunction(obj) else ""
        if name is None:
            if not handler:
                raise ConfigError(f"@app.{kind} cannot name {obj!r}: pass name='web'")
            name = handler.replace("_", "-").strip("-")  # names are URL paths: say_hello -> say-hello
        check_name(name, f"{kind} name")
        return handler, self._unique(name)

    def _unique(self, name: str) -> str:
        if any(r.spec["name"] == name for r in self._registrations):
            raise ConfigError(f"app {self.name!r} already has an endpoint named {name!r}: pass another name=")
        return name

    def specs(self) -> list[dict[str, Any]]:
        """The spec of every endpoint and function, as the gateway receives them (copies)."""
        return [copy.deepcopy(r.spec) for r in self._registrations]


# ---- loading a user's file -----------------------------------------------------------------------

SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "dist-packages"}


def _is_code_dir(path: Path) -> bool:
    """Whether a directory's .py files belong to the user's code (not a venv, cache or hidden dir)."""
    return not (path.name.startswith(".") or path.name in SKIP_DIRS or (path / "pyvenv.cfg").exists())


def _forget_modules_under(directory: Path) -> None:
    """Drop the user's modules from sys.modules so the next import reads the files again."""
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or name == "levers9" or name.startswith("levers9."):
            continue
        try:
            rel = Path(file).resolve().relative_to(directory)
        except ValueError:
            continue
        parents = [directory.joinpath(*rel.parts[:i]) for i in range(1, len(rel.parts))]
        if all(_is_code_dir(p) for p in parents):
            del sys.modules[name]


def _where(exc: BaseException, directory: Path) -> str:
    """'hello.py line 3: import numpyy' for the deepest traceback frame in the user's directory."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename and not f.filename.startswith("<")
              and Path(f.filename).resolve().is_relative_to(directory)]
    if not frames:
        return ""
    f = frames[-1]
    place = f"{os.path.relpath(f.filename, directory)} line {f.lineno}"
    return f"{place}: {f.line.strip()}" if f.line else place


def _import_file(path: Path) -> Any:
    directory = path.parent
    stem = path.stem
    if not stem.isidentifier():
        raise ConfigError(f"{path.name} cannot be imported as a module: rename it to "
                          f"{re.sub(r'[^0-9A-Za-z_]', '_', stem)}.py")
    if stem in sys.stdlib_module_names or stem == "levers9":
        raise ConfigError(f"{path.name} has the name of the module {stem!r}, which the container already has: "
                          f"rename it, e.g. to {stem}_app.py")
    _forget_modules_under(directory)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    spec = importlib.util.spec_from_file_location(stem, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path} cannot be imported: give it a .py name")
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(stem, None)
        file = os.path.relpath(exc.filename, directory) if exc.filename else path.name
        text = f": {exc.text.strip()}" if exc.text else ""
        raise ConfigError(f"{file} line {exc.lineno}: {type(exc).__name__}: {exc.msg}{text}: fix the syntax "
                          "and try again") from None
    except ConfigError as exc:
        sys.modules.pop(stem, None)
        where = _where(exc, directory)
        raise ConfigError(f"{where}: {exc}" if where else str(exc)) from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - whatever the user's module raises becomes a ConfigError naming it
        sys.modules.pop(stem, None)
        where = _where(exc, directory) or path.name
        fix = ("install it here, or import it inside the function that needs it"
               if isinstance(exc, ImportError) else
               "fix the error: the file is imported to read its endpoints, so it must import cleanly")
        raise ConfigError(f"importing {path.name} failed at {where}: {type(exc).__name__}: {exc}: {fix}") from None
    return module


def _resolve(reg: _Registration, module: Any, path: Path) -> dict[str, Any]:
    """The spec with module and handler checked (or found) the way the container will look them up."""
    spec = copy.deepcopy(reg.spec)
    code = spec["code"]
    if code["kind"] == "box":  # its command is its code: nothing to find in the module
        return spec
    owner = sys.modules.get(code["module"]) if code["module"] else None
    if not (owner is not None and getattr(owner, code["handler"], None) is reg.obj):
        found = [n for n, v in vars(module).items() if v is reg.obj and not n.startswith("__")]
        if not found:
            what = code["handler"] or spec["name"]
            raise ConfigError(f"endpoint {spec['name']!r}: {what} cannot be found by name in {path.name}: "
                              "define it (or assign it) at the top level of the module")
        code["module"], code["handler"] = module.__name__, found[0]
        owner = module
    if reg.on_start is not None and getattr(owner, code["on_start"], None) is not reg.on_start:
        raise ConfigError(f"endpoint {spec['name']!r}: on_start {code['on_start']} cannot be found by name in "
                          f"module {code['module']}: define it at the top level of that module, or import it there")
    return spec


def _app_file(path: str | os.PathLike[str]) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"there is no file {path}: check the path")
    if path.suffix != ".py":
        raise ConfigError(f"{path} is not a Python file: pass the .py file that defines the App")
    return path.resolve()


def load_function(path: str | os.PathLike[str], name: str) -> Any:
    """Import a .py file as load_app_file does and return its `@app.function` named `name` (the
    Python name, or the name it is deployed by)."""
    from levers9.functions import Function

    path = _app_file(path)
    module = _import_file(path)
    found = getattr(module, name, None)
    if not isinstance(found, Function):
        found = next((v for v in vars(module).values() if isinstance(v, Function) and v.name == name), None)
    if found is None:
        names = sorted(k for k, v in vars(module).items() if isinstance(v, Function))
        hint = f": it has {', '.join(names)}" if names else ": decorate one with @app.function()"
        raise ConfigError(f"{path.name} has no @app.function named {name!r}{hint}")
    return found


def load_app_file(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Import a .py file (as a module named by its stem, its directory on sys.path) and return the
    specs of every App in it."""
    path = _app_file(path)
    module = _import_file(path)
    apps = list({id(v): v for v in vars(module).values() if isinstance(v, App)}.values())
    if not apps:
        raise ConfigError(f"{path.name} defines no levers9 App: add `app = App(\"my-app\")` and decorate a "
                          "function with @app.endpoint() or @app.function()")
    specs: list[dict[str, Any]] = []
    for a in apps:
        specs.extend(_resolve(reg, module, path) for reg in a._registrations)
    if not specs:
        names = ", ".join(repr(a.name) for a in apps)
        raise ConfigError(f"{path.name} defines App {names} but no endpoint: decorate a function with "
                          "@app.endpoint(), @app.asgi() or @app.function()")
    seen: set[str] = set()
    for spec in specs:
        if spec["name"] in seen:
            raise ConfigError(f"{path.name} has two endpoints named {spec['name']!r}: give one another name=")
        seen.add(spec["name"])
    return specs
