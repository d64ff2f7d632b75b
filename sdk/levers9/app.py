"""The SDK: `App`, its `@app.endpoint` and `@app.asgi` decorators, `Image`, `Secret`, and
`load_app_file`, which reads the specs the gateway receives out of a user's .py file.

Standard library only: inside a container this package is mounted alone on a bare python3, and the
user's file imports it (`from levers9 import App`) before the runner can serve anything.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import math
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["App", "ConfigError", "Image", "Secret", "load_app_file", "parse_cpu", "parse_memory", "parse_gpu"]

# app and pool names end up in URLs, subjects and labels: a DNS label
APP_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
MIN_MEMORY_MIB = 16  # what the gateway accepts
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
GPU_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
MEMORY_RE = re.compile(r"^(\d+(?:\.\d+)?)(Mi|Gi|Ti|M|G|T)?$")
MEMORY_UNITS_MIB = {None: 1, "Mi": 1, "M": 1, "Gi": 1024, "G": 1024, "Ti": 1024 * 1024, "T": 1024 * 1024}
CPU_RE = re.compile(r"^(\d+(?:\.\d+)?)(m)?$")

SPEC_KEYS = ("name", "kind", "module", "handler", "on_start", "cpu_millicores", "memory_mib", "gpu",
             "gpu_count", "image", "keep_warm_seconds", "min_containers", "max_containers", "concurrency",
             "timeout_seconds", "secrets", "env", "checkpoint_enabled", "pool", "app_name")


class ConfigError(ValueError):
    """A mistake in an app's configuration; the message says what is wrong and how to fix it."""


# ---- parsing one option ------------------------------------------------------------------------

def parse_memory(value: Any) -> int:
    """Memory in MiB: an int (MiB) or a string like '512Mi', '2Gi', '1G', '512M'.

    M and G mean MiB and GiB, as in Docker (`--memory 1g` is 1024 MiB). Fractions round up: '1.5Gi'
    is 1536, '0.5Mi' is 1.
    """
    def bad() -> ConfigError:
        return ConfigError(f"memory {value!r} is not understood: use MiB as a number or a string like "
                           "'512Mi' or '2Gi'")

    if isinstance(value, bool):
        raise bad()
    if isinstance(value, int):
        mib = value
    elif isinstance(value, float) and value.is_integer():
        mib = int(value)
    elif isinstance(value, str):
        m = MEMORY_RE.match(value.strip())
        if not m:
            raise bad()
        mib = math.ceil(float(m.group(1)) * MEMORY_UNITS_MIB[m.group(2)])
    else:
        raise bad()
    if mib < MIN_MEMORY_MIB:
        raise ConfigError(f"memory {value!r} is too small: ask for at least {MIN_MEMORY_MIB} MiB, e.g. "
                          "memory='256Mi'")
    return mib


def parse_cpu(value: Any) -> int:
    """CPU in millicores from cores (0.5, 2) or a string ('0.5', '500m')."""
    def bad() -> ConfigError:
        return ConfigError(f"cpu {value!r} is not understood: use cores as a positive number, e.g. cpu=0.5 "
                           "or cpu=2 (or a string like '500m')")

    if isinstance(value, bool):
        raise bad()
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value <= 0:
            raise bad()
        millicores = round(value * 1000)
    elif isinstance(value, str):
        m = CPU_RE.match(value.strip())
        if not m:
            raise bad()
        number = float(m.group(1))
        millicores = round(number if m.group(2) else number * 1000)
    else:
        raise bad()
    if millicores < 1:
        raise ConfigError(f"cpu {value!r} is too small: ask for at least 0.001 cores (cpu='1m')")
    return millicores


def parse_gpu(gpu: Any) -> list[str]:
    """GPU types in order of preference: None, 'T4', or ['H100', 'A100']; duplicates dropped."""
    if gpu is None:
        return []
    names = [gpu] if isinstance(gpu, str) else gpu
    if not isinstance(names, (list, tuple)) or not names:
        raise ConfigError(f"gpu {gpu!r} is not understood: use None, a type like 'T4', or a list in order "
                          "of preference like ['H100', 'A100']")
    out: list[str] = []
    for name in names:
        if not isinstance(name, str) or not GPU_NAME_RE.match(name.strip()):
            raise ConfigError(f"gpu type {name!r} is not a GPU type name: use names like 'T4', 'A100' or "
                              "'H100'")
        if name.strip() not in out:
            out.append(name.strip())
    return out


def _gpu_count(gpu_count: Any, gpus: list[str]) -> int:
    if gpu_count is None:
        return 1 if gpus else 0
    count = _whole(gpu_count, "gpu_count", 0, "gpu_count=1")
    if gpus and count == 0:
        raise ConfigError(f"gpu={gpus!r} with gpu_count=0 asks for no GPU: drop gpu, or set gpu_count=1")
    return count


def _whole(value: Any, option: str, minimum: int, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{option} {value!r} is not valid: use a whole number of at least {minimum}, "
                          f"e.g. {example}")
    return value


def _suggest(name: str) -> str:
    s = re.sub("[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-")
    return s or "my-app"


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not APP_NAME_RE.match(name):
        hint = _suggest(name) if isinstance(name, str) else "my-app"
        raise ConfigError(f"{what} {name!r} is not valid: use lowercase letters, digits and '-', at most 63, "
                          f"starting and ending with a letter or digit, e.g. {hint!r}")
    return name


# ---- Image and Secret ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Image:
    """The container image: recorded in the spec (the image builder comes later)."""
    python_packages: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    base: str = "debian:bookworm"

    def __post_init__(self) -> None:
        for option in ("python_packages", "commands"):
            value = getattr(self, option)
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or \
                    not all(isinstance(v, str) and v.strip() for v in value):
                raise ConfigError(f"Image {option} {value!r} is not valid: use a list of strings, e.g. "
                                  f"{option}={['numpy==2.1.0'] if option == 'python_packages' else ['apt-get update']}")
            object.__setattr__(self, option, list(value))
        if not isinstance(self.base, str) or not self.base.strip():
            raise ConfigError(f"Image base {self.base!r} is not valid: name an image, e.g. base='debian:bookworm'")

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base, "python_packages": list(self.python_packages), "commands": list(self.commands)}


@dataclass(frozen=True)
class Secret:
    """A secret stored with `levers9 secret create NAME VALUE`, given to the container as $NAME."""
    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not ENV_NAME_RE.match(self.name):
            raise ConfigError(f"secret name {self.name!r} is not valid: it becomes an environment variable, so "
                              "use letters, digits and '_', not starting with a digit, e.g. 'OPENAI_API_KEY'")


def _secret_names(secrets: Any) -> list[str]:
    if secrets is None:
        return []
    if isinstance(secrets, (str, Secret)) or not isinstance(secrets, (list, tuple)):
        raise ConfigError(f"secrets {secrets!r} is not valid: use a list of names or Secret objects, e.g. "
                          "secrets=['API_KEY']")
    names: list[str] = []
    for s in secrets:
        name = (s if isinstance(s, Secret) else Secret(s)).name
        if name not in names:
            names.append(name)
    return names


def _env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ConfigError(f"env {env!r} is not valid: use a dict of strings, e.g. env={{'LOG_LEVEL': 'info'}}")
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME_RE.match(key):
            raise ConfigError(f"env name {key!r} is not valid: use letters, digits and '_', not starting with a "
                              "digit, e.g. 'LOG_LEVEL'")
        if key.upper().startswith("LEVERS9_"):
            raise ConfigError(f"env name {key!r} is reserved: LEVERS9_* variables belong to the runner; "
                              "choose another name")
        if not isinstance(value, str):
            raise ConfigError(f"env[{key!r}] = {value!r} is not a string: write it as one, e.g. {str(value)!r}")
    return dict(env)


def _on_start_name(on_start: Any) -> str:
    if on_start is None:
        return ""
    name = getattr(on_start, "__name__", "")
    qualname = getattr(on_start, "__qualname__", "")
    if not callable(on_start) or not inspect.isfunction(on_start) or name == "<lambda>" or qualname != name:
        raise ConfigError(f"on_start {on_start!r} is not valid: the container finds it by name, so pass a "
                          "function defined at the top level of the module (def load(): ...; on_start=load)")
    return name


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
        self.name = _check_name(name, "app name")
        self._registrations: list[_Registration] = []

    def __repr__(self) -> str:
        return f"App({self.name!r}, endpoints={[r.spec['name'] for r in self._registrations]})"

    def endpoint(self, func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Deploy a function as an HTTP endpoint: the JSON body's fields become its keyword arguments.

        Options: name (default: the function's name, '_' written '-'), cpu (cores), memory (MiB, or
        '512Mi'/'2Gi'), gpu (a type or a list in order of preference), gpu_count, image,
        keep_warm_seconds, min_containers, max_containers, concurrency, timeout (seconds), secrets,
        env, on_start (a top-level function; its value is context.on_start_value),
        checkpoint_enabled, pool. A mistake raises ConfigError saying how to fix it.
        """
        return self._decorator("endpoint", func, options)

    def asgi(self, func: Any = None, /, **options: Any) -> Any:
        """Deploy an ASGI app: decorate a function returning one, or pass the app object itself."""
        return self._decorator("asgi", func, options)

    def _decorator(self, kind: str, func: Any, options: dict[str, Any]) -> Any:
        def register(obj: Any) -> Any:
            self._register(kind, obj, **options)
            return obj  # stays callable locally, unchanged

        return register(func) if func is not None else register

    def _register(self, kind: str, obj: Any, *, name: str | None = None, cpu: Any = 1.0, memory: Any = 1024,
                  gpu: Any = None, gpu_count: int | None = None, image: Image | None = None,
                  keep_warm_seconds: int = 60, min_containers: int = 0, max_containers: int = 1,
                  concurrency: int = 1, timeout: int = 180, secrets: Any = None, env: Any = None,
                  on_start: Callable[..., Any] | None = None, checkpoint_enabled: bool = False,
                  pool: str = "default") -> None:
        if not callable(obj):
            raise ConfigError(f"@app.{kind} was given {obj!r}, which is not callable: decorate a function"
                              + (" or pass an ASGI app" if kind == "asgi" else ""))
        handler = getattr(obj, "__name__", "") if inspect.isfunction(obj) else ""
        if name is None:
            if not handler:
                raise ConfigError(f"@app.{kind} cannot name {obj!r}: pass name='web'")
            name = handler.replace("_", "-").strip("-")  # names are URL paths: say_hello -> say-hello
        _check_name(name, f"{kind} name")
        if any(r.spec["name"] == name for r in self._registrations):
            raise ConfigError(f"app {self.name!r} already has an endpoint named {name!r}: pass another name=")
        if image is not None and not isinstance(image, Image):
            raise ConfigError(f"image {image!r} is not valid: use Image(python_packages=[...]) or None")
        if not isinstance(checkpoint_enabled, bool):
            raise ConfigError(f"checkpoint_enabled {checkpoint_enabled!r} is not valid: use True or False")
        gpus = parse_gpu(gpu)
        min_c = _whole(min_containers, "min_containers", 0, "min_containers=0")
        max_c = _whole(max_containers, "max_containers", 1, "max_containers=1")
        if max_c < min_c:
            raise ConfigError(f"max_containers={max_c} is below min_containers={min_c}: raise max_containers "
                              f"to at least {min_c}")
        spec = {
            "name": name,
            "kind": kind,
            "module": _module_name(obj) if handler else "",
            "handler": handler,
            "on_start": _on_start_name(on_start),
            "cpu_millicores": parse_cpu(cpu),
            "memory_mib": parse_memory(memory),
            "gpu": gpus,
            "gpu_count": _gpu_count(gpu_count, gpus),
            "image": image.to_dict() if image is not None else None,
            "keep_warm_seconds": _whole(keep_warm_seconds, "keep_warm_seconds", 0, "keep_warm_seconds=60"),
            "min_containers": min_c,
            "max_containers": max_c,
            "concurrency": _whole(concurrency, "concurrency", 1, "concurrency=4"),
            "timeout_seconds": _whole(timeout, "timeout", 1, "timeout=180"),
            "secrets": _secret_names(secrets),
            "env": _env(env),
            "checkpoint_enabled": checkpoint_enabled,
            "pool": _check_name(pool, "pool"),
            "app_name": self.name,
        }
        self._registrations.append(_Registration(obj, spec, on_start))

    def specs(self) -> list[dict[str, Any]]:
        """The spec of every endpoint, as the gateway receives them (copies)."""
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
    except (Exception, SystemExit) as exc:
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
    owner = sys.modules.get(spec["module"]) if spec["module"] else None
    if not (owner is not None and getattr(owner, spec["handler"], None) is reg.obj):
        found = [n for n, v in vars(module).items() if v is reg.obj and not n.startswith("__")]
        if not found:
            what = spec["handler"] or spec["name"]
            raise ConfigError(f"endpoint {spec['name']!r}: {what} cannot be found by name in {path.name}: "
                              "define it (or assign it) at the top level of the module")
        spec["module"], spec["handler"] = module.__name__, found[0]
        owner = module
    if reg.on_start is not None and getattr(owner, spec["on_start"], None) is not reg.on_start:
        raise ConfigError(f"endpoint {spec['name']!r}: on_start {spec['on_start']} cannot be found by name in "
                          f"module {spec['module']}: define it at the top level of that module, or import it there")
    return spec


def load_app_file(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Import a .py file (as a module named by its stem, its directory on sys.path) and return the
    specs of every App in it."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"there is no file {path}: check the path")
    if path.suffix != ".py":
        raise ConfigError(f"{path} is not a Python file: pass the .py file that defines the App")
    path = path.resolve()
    module = _import_file(path)
    apps = list({id(v): v for v in vars(module).values() if isinstance(v, App)}.values())
    if not apps:
        raise ConfigError(f"{path.name} defines no levers9 App: add `app = App(\"my-app\")` and decorate a "
                          "function with @app.endpoint()")
    specs: list[dict[str, Any]] = []
    for a in apps:
        specs.extend(_resolve(reg, module, path) for reg in a._registrations)
    if not specs:
        names = ", ".join(repr(a.name) for a in apps)
        raise ConfigError(f"{path.name} defines App {names} but no endpoint: decorate a function with "
                          "@app.endpoint() or @app.asgi()")
    seen: set[str] = set()
    for spec in specs:
        if spec["name"] in seen:
            raise ConfigError(f"{path.name} has two endpoints named {spec['name']!r}: give one another name=")
        seen.add(spec["name"])
    return specs
