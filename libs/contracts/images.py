"""Blueprints as build steps, and the content hashes that name steps and images (pure).

A blueprint builds in this order, one layer per step: the base; the apt packages (one step); the
python packages (one step); each command (a step each). A step's hash covers its own text and the
hash of the step before it, so a changed line changes the hash of that step and of every step after
it: those rebuild, the ones before are reused. The environment is image config, not a layer: it is
set on the final image (and for every step's commands), so changing it rebuilds nothing. The image id
hashes the last step's hash with the environment: one blueprint is one image wherever it is built.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

import msgspec

from .spec import ImageSpec

# the platform's base as the blueprint names it; the builder resolves it to the registry it pushed
# the base to. Its name changes when what the base holds changes (rootfs.BASE_NAME), so do the ids.
PLATFORM_BASE = "levers9/base:bookworm-python3-base"
IMAGE_REPOSITORY = "levers9/images"  # built images: <registry>/levers9/images:<image id>
CACHE_REPOSITORY = "levers9/cache"  # one tag per step: <registry>/levers9/cache:<step hash>
ID_PREFIX = "im-"
# the pool whose workers build images: the pool controller keeps it, the image-builder gives it
# builds, the gateway refuses deployments to it
BUILD_POOL = "build"

StepKind = Literal["base", "apt", "pip", "run"]


class BuildStep(msgspec.Struct, frozen=True, kw_only=True):
    index: int  # 0 is the base
    kind: StepKind
    args: list[str]  # base: [reference]; apt/pip: the packages; run: [command]
    hash: str  # sha256 hex over the previous step's hash and this step

    @property
    def text(self) -> str:
        """The step as the build log shows it."""
        if self.kind == "base":
            return f"FROM {self.args[0]}"
        if self.kind == "apt":
            return "RUN apt-get install " + " ".join(self.args)
        if self.kind == "pip":
            return "RUN pip install " + " ".join(self.args)
        return "RUN " + self.args[0]

    @property
    def cache_tag(self) -> str:
        return f"{CACHE_REPOSITORY}:{self.hash}"


def base_of(image: ImageSpec) -> str:
    return image.base_image or PLATFORM_BASE


def build_steps(image: ImageSpec) -> list[BuildStep]:
    """The blueprint's steps in build order, each with its chained hash."""
    raw: list[tuple[StepKind, list[str]]] = [("base", [base_of(image)])]
    if image.apt_packages:
        raw.append(("apt", list(image.apt_packages)))
    if image.python_packages:
        raw.append(("pip", list(image.python_packages)))
    raw += [("run", [command]) for command in image.commands]
    steps, previous = [], ""
    for index, (kind, args) in enumerate(raw):
        digest = hashlib.sha256(json.dumps([previous, kind, args]).encode()).hexdigest()
        steps.append(BuildStep(index=index, kind=kind, args=args, hash=digest))
        previous = digest
    return steps


def env_list(image: ImageSpec) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(image.env.items())]


def image_id(image: ImageSpec) -> str:
    """The content hash of the blueprint: `im-` and 24 hex digits of the hash of its last step's
    hash and its environment."""
    last = build_steps(image)[-1].hash
    return ID_PREFIX + hashlib.sha256(json.dumps([last, env_list(image)]).encode()).hexdigest()[:24]


def image_tag(image_id_: str) -> str:
    return f"{IMAGE_REPOSITORY}:{image_id_}"


def cached_prefix(steps: list[BuildStep], cached: set[str]) -> int:
    """How many steps from the start are in the layer cache (by hash): the build resumes after them.
    The base counts as cached when it is (it is pulled, never run). A step is reused only if every
    step before it is too, since its layer sits on theirs."""
    n = 0
    for step in steps:
        if step.hash not in cached:
            break
        n += 1
    return n
