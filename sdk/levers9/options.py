"""The options of `@app.endpoint` and `@app.asgi`: each one checked and turned into the spec's units
(cpu in millicores, memory in MiB, seconds), with a `ConfigError` that says how to fix a mistake.

Standard library only (imported inside containers, see levers9.app).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable

# app and pool names end up in URLs, subjects and labels: a DNS label
APP_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
MIN_MEMORY_MIB = 16  # DeploymentSpec's minimum (tests/unit/test_sdk_spec.py keeps them equal)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
GPU_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
MEMORY_RE = re.compile(r"^(\d+(?:\.\d+)?)(Mi|Gi|Ti|M|G|T)?$")
MEMORY_UNITS_MIB = {None: 1, "Mi": 1, "M": 1, "Gi": 1024, "G": 1024, "Ti": 1024 * 1024, "T": 1024 * 1024}
CPU_RE = re.compile(r"^(\d+(?:\.\d+)?)(m)?$")

# DeploymentSpec's defaults (levers9.contracts.spec) are the defaults: an option that was not passed
# stays out of the spec. These two the SDK needs for its own check of min against max;
# tests/unit/test_sdk_spec.py keeps them equal to the Struct's.
DEFAULT_MIN_CONTAINERS = 0
DEFAULT_MAX_CONTAINERS = 1


class _Unset:
    """An option that was not passed: the spec leaves it out."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


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


def count_gpus(gpu_count: Any, gpus: list[str]) -> int:
    if gpu_count is None:
        return 1 if gpus else 0
    count = whole(gpu_count, "gpu_count", 0, "gpu_count=1")
    if gpus and count == 0:
        raise ConfigError(f"gpu={gpus!r} with gpu_count=0 asks for no GPU: drop gpu, or set gpu_count=1")
    return count


def resources(cpu: Any, memory: Any, gpu: Any, gpu_count: Any) -> Any:
    """The spec's resources: cpu in millicores, memory in MiB, GPU types and count, as passed."""
    gpus = parse_gpu(gpu)
    count = count_gpus(gpu_count, gpus)
    return section({
        "cpu_millicores": given(cpu, parse_cpu),
        "memory_mib": given(memory, parse_memory),
        "gpu": gpus if gpu is not None else UNSET,
        "gpu_count": count if gpu_count is not None or count else UNSET,
    })


def given(value: Any, parse: Callable[[Any], Any]) -> Any:
    """parse(value) when the option was passed; UNSET when not."""
    return UNSET if value is UNSET else parse(value)


def drop_unset(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if v is not UNSET}


def section(doc: dict[str, Any]) -> Any:
    """A nested part of the spec (resources, scaling) with what was set; UNSET when nothing was."""
    return drop_unset(doc) or UNSET


def whole(value: Any, option: str, minimum: int, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{option} {value!r} is not valid: use a whole number of at least {minimum}, "
                          f"e.g. {example}")
    return value


def suggest(name: str) -> str:
    s = re.sub("[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-")
    return s or "my-app"


def check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not APP_NAME_RE.match(name):
        hint = suggest(name) if isinstance(name, str) else "my-app"
        raise ConfigError(f"{what} {name!r} is not valid: use lowercase letters, digits and '-', at most 63, "
                          f"starting and ending with a letter or digit, e.g. {hint!r}")
    return name


# ---- Image and Secret ----------------------------------------------------------------------------

# ImageSpec's field rules (levers9.contracts.spec), as whole-string matches; tests/unit/test_sdk_spec.py
# checks that whatever the SDK accepts the Struct accepts
PYTHON_PACKAGE_RE = re.compile(r"[A-Za-z0-9][^\n\r\x00]*")
APT_PACKAGE_RE = re.compile(r"[a-z0-9][a-z0-9+.-]*(=[A-Za-z0-9.+:~-]+)?")
IMAGE_REFERENCE_RE = re.compile(r"[a-z0-9][a-z0-9._/:@-]*")
IMAGE_LIMITS = {"python_packages": 400, "apt_packages": 200, "commands": 8192}
IMAGE_EXAMPLES = {"python_packages": "'humanize==4.9.0'", "apt_packages": "'curl'",
                  "commands": "'mkdir -p /srv/data'"}
# the platform's base as blueprints name it, and its Python (Debian bookworm's); the image id hashes
# the name, so it is levers9.contracts.images.PLATFORM_BASE exactly (a unit test keeps them equal)
PLATFORM_BASE = "levers9/base:bookworm-python3-base"
PLATFORM_PYTHON = "3.11"


def _image_item(option: str, value: Any) -> str:
    """One package or command, checked against the blueprint's rule for its field."""
    fine = isinstance(value, str) and len(value) <= IMAGE_LIMITS[option] and (
        PYTHON_PACKAGE_RE.fullmatch(value) if option == "python_packages" else
        APT_PACKAGE_RE.fullmatch(value) if option == "apt_packages" else
        (value.strip() and "\x00" not in value))
    if not fine:
        why = {"python_packages": "a pip requirement starting with a letter or digit, on one line (pip options "
                                  "are not allowed)",
               "apt_packages": "a Debian package name in lowercase, optionally =version",
               "commands": "a non-empty shell command without NUL bytes"}[option]
        raise ConfigError(f"Image {option} item {value!r} is not valid: use {why}, at most {IMAGE_LIMITS[option]} "
                          f"characters, e.g. {IMAGE_EXAMPLES[option]}")
    return value


def _image_items(option: str, values: Any) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, (list, tuple)):
        raise ConfigError(f"Image {option} {values!r} is not valid: use a list of strings, e.g. "
                          f"{option}=[{IMAGE_EXAMPLES[option]}]")
    return tuple(_image_item(option, v) for v in values)


def _image_env(env: Any) -> dict[str, str]:
    if not isinstance(env, dict):
        raise ConfigError(f"Image env {env!r} is not valid: use a dict of strings, e.g. env={{'MODE': 'prod'}}")
    checked = env_vars(env)
    for key in checked:
        if len(key) > 128:
            raise ConfigError(f"Image env name {key[:20]!r}... is too long: at most 128 characters")
    return checked


def _hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()


@dataclass(frozen=True)
class Image:
    """A blueprint: the base (the platform's Debian bookworm with python3, pip and venv unless
    `base_image` names another), then apt packages, python packages, each command, and the
    environment. Immutable: the helpers return a new Image.

        Image(python_packages=["humanize==4.9.0"]).add_commands("mkdir -p /srv").with_env(MODE="prod")

    Its `id` is the content hash the platform names the built image by; `levers9 deploy` builds it
    (once: identical blueprints share it) before deploying."""
    python_packages: Sequence[str] = ()  # kept as tuples
    apt_packages: Sequence[str] = ()
    commands: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    base_image: str | None = None

    def __post_init__(self) -> None:
        for option in ("python_packages", "apt_packages", "commands"):
            object.__setattr__(self, option, _image_items(option, getattr(self, option)))
        object.__setattr__(self, "env", MappingProxyType(_image_env(dict(self.env) if isinstance(
            self.env, Mapping) else self.env)))
        base = self.base_image
        if base is not None and not (isinstance(base, str) and len(base) <= 256
                                     and IMAGE_REFERENCE_RE.fullmatch(base)):
            raise ConfigError(f"Image base_image {base!r} is not valid: name an image in a registry the platform "
                              "reaches, in lowercase, e.g. base_image='localhost:5000/team/base:1', or leave it "
                              "None for the platform's base")

    def __hash__(self) -> int:
        return hash(self.id)

    # -- chaining: each returns a new Image --

    def add_python_packages(self, *packages: str) -> "Image":
        return replace(self, python_packages=(*self.python_packages, *_image_items("python_packages", _flat(packages))))

    def add_apt_packages(self, *packages: str) -> "Image":
        return replace(self, apt_packages=(*self.apt_packages, *_image_items("apt_packages", _flat(packages))))

    def add_commands(self, *commands: str) -> "Image":
        return replace(self, commands=(*self.commands, *_image_items("commands", _flat(commands))))

    def with_env(self, env: Mapping[str, str] | None = None, /, **variables: str) -> "Image":
        if env is not None and not isinstance(env, Mapping):
            raise ConfigError(f"Image.with_env({env!r}) is not valid: pass a dict or NAME='value' keywords")
        return replace(self, env={**self.env, **dict(env or {}), **variables})

    @classmethod
    def from_requirements(cls, path: str | os.PathLike[str], **options: Any) -> "Image":
        """An Image whose python packages are a requirements file's lines (comments and blank lines
        skipped); pip options (-r, -e, --index-url, ...) are refused: list the packages themselves."""
        return cls(python_packages=read_requirements(path), **options)

    # -- what the platform receives --

    def to_dict(self) -> dict[str, Any]:
        """The blueprint as levers9.contracts.spec.ImageSpec JSON, holding only what was set."""
        doc: dict[str, Any] = {"base_image": self.base_image or None, "apt_packages": list(self.apt_packages),
                               "python_packages": list(self.python_packages), "commands": list(self.commands),
                               "env": dict(self.env)}
        return {k: v for k, v in doc.items() if v}

    @property
    def id(self) -> str:
        """The content hash of the blueprint, computed as levers9.contracts.images.image_id does:
        each step's hash chains the one before; the environment is hashed with the last."""
        steps: list[tuple[str, list[str]]] = [("base", [self.base_image or PLATFORM_BASE])]
        if self.apt_packages:
            steps.append(("apt", list(self.apt_packages)))
        if self.python_packages:
            steps.append(("pip", list(self.python_packages)))
        steps += [("run", [c]) for c in self.commands]
        last = ""
        for kind, args in steps:
            last = _hash(last, kind, args)
        return "im-" + _hash(last, [f"{k}={v}" for k, v in sorted(self.env.items())])[:24]

    @property
    def python_version(self) -> str | None:
        """major.minor of the image's python3: known for the platform's base, None for another base."""
        return PLATFORM_PYTHON if not self.base_image else None


def _flat(values: tuple[Any, ...]) -> list[Any]:
    """add_*("a", "b") and add_*(["a", "b"]) alike."""
    return [v for item in values for v in (item if isinstance(item, (list, tuple)) else [item])]


def read_requirements(path: str | os.PathLike[str]) -> list[str]:
    file = Path(path).expanduser()
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read requirements file {file}: {exc.strerror or exc}: check the path") from None
    packages: list[str] = []
    for number, raw in enumerate(text.replace("\\\n", "").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise ConfigError(f"{file.name} line {number}: {line!r} is a pip option, which an Image cannot take: "
                              "list the packages themselves (for -r, add that file's packages too)")
        packages.append(line)
    return packages


@dataclass(frozen=True)
class Secret:
    """A secret stored with `levers9 secret create NAME VALUE`, given to the container as $NAME."""
    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not ENV_NAME_RE.match(self.name):
            raise ConfigError(f"secret name {self.name!r} is not valid: it becomes an environment variable, so "
                              "use letters, digits and '_', not starting with a digit, e.g. 'OPENAI_API_KEY'")


def secret_names(secrets: Any) -> list[str]:
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


def env_vars(env: Any) -> dict[str, str]:
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


def on_start_name(on_start: Any) -> str:
    if on_start is None:
        return ""
    name = getattr(on_start, "__name__", "")
    qualname = getattr(on_start, "__qualname__", "")
    if not callable(on_start) or not inspect.isfunction(on_start) or name == "<lambda>" or qualname != name:
        raise ConfigError(f"on_start {on_start!r} is not valid: the container finds it by name, so pass a "
                          "function defined at the top level of the module (def load(): ...; on_start=load)")
    return name
