"""The options of `@app.endpoint` and `@app.asgi`: each one checked and turned into the spec's units
(cpu in millicores, memory in MiB, seconds), with a `ConfigError` that says how to fix a mistake.

Standard library only (imported inside containers, see levers9.app).
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass, field
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


def scaling(keep_warm_seconds: Any, min_containers: Any, max_containers: Any, concurrency: Any) -> Any:
    """The spec's scaling, as passed; min_containers is checked against max_containers either way."""
    min_c = given(min_containers, lambda v: whole(v, "min_containers", 0, "min_containers=0"))
    max_c = given(max_containers, lambda v: whole(v, "max_containers", 1, "max_containers=1"))
    low = DEFAULT_MIN_CONTAINERS if min_c is UNSET else min_c
    high = DEFAULT_MAX_CONTAINERS if max_c is UNSET else max_c
    if high < low:
        raise ConfigError(f"max_containers={high} is below min_containers={low}: raise max_containers "
                          f"to at least {low}")
    return section({
        "keep_warm_seconds": given(keep_warm_seconds,
                                   lambda v: whole(v, "keep_warm_seconds", 0, "keep_warm_seconds=60")),
        "min_containers": min_c,
        "max_containers": max_c,
        "concurrency": given(concurrency, lambda v: whole(v, "concurrency", 1, "concurrency=4")),
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
