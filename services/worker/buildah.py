"""A thin async wrapper of the buildah and skopeo CLIs (Debian's), as the builder uses them.

Every call raises `ToolError` with the command and its output when the tool exits non-zero, except
`run`, whose exit code is the build step's result. Registries on loopback speak plain HTTP, so
references to them get `--tls-verify=false` (and only those).
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

LINE_LIMIT = 1 << 20  # a line longer than this (a progress bar without newlines) is cut, not fatal
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


class ToolError(RuntimeError):
    def __init__(self, argv: list[str], code: int | None, output: str) -> None:
        self.argv, self.code, self.output = argv, code, output
        super().__init__(f"`{' '.join(argv[:4])}{' …' if len(argv) > 4 else ''}` exited {code}: "
                         f"{output.strip()[-800:]}")


@dataclass(frozen=True)
class Mount:
    """A host path bound read-only into a step's container."""
    source: str
    target: str

    def flag(self) -> str:
        return f"{self.source}:{self.target}:ro"


def registry_of(reference: str) -> str:
    """The registry host of an image reference, "" for a short name (`levers9/cache:x`)."""
    first = reference.split("/", 1)[0]
    if "/" in reference and ("." in first or ":" in first or first == "localhost"):
        return first
    return ""


def host_of(registry: str) -> str:
    """`127.0.0.1:5000` -> `127.0.0.1`, `[::1]:5000` -> `[::1]`."""
    if registry.startswith("["):
        return registry.split("]", 1)[0] + "]"
    return registry.rsplit(":", 1)[0]


def tls_flags(reference: str) -> list[str]:
    return ["--tls-verify=false"] if host_of(registry_of(reference)) in LOOPBACK else []


async def tool(*argv: str, check: bool = True) -> str:
    """Run a CLI to its end; its stdout and stderr together."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    if check and proc.returncode != 0:
        raise ToolError(list(argv), proc.returncode, text)
    return text


# ---- working containers -----------------------------------------------------------------------------

async def from_image(reference: str, name: str) -> str:
    """A working container `name` from `reference` (pulled when not local); an old one of that name
    (left by a crash) is removed first."""
    await remove(name)
    out = await tool("buildah", "from", "--quiet", "--name", name, *tls_flags(reference), reference)
    return out.strip().splitlines()[-1]


async def from_scratch(name: str) -> str:
    await remove(name)
    return (await tool("buildah", "from", "--quiet", "--name", name, "scratch")).strip().splitlines()[-1]


async def remove(container: str) -> None:
    """Remove a working container if it exists (its mounts go with it)."""
    await tool("buildah", "rm", container, check=False)


async def mount(container: str) -> Path:
    return Path((await tool("buildah", "mount", container)).strip().splitlines()[-1])


async def umount(container: str) -> None:
    await tool("buildah", "umount", container)


async def set_env(container: str, env: list[str]) -> None:
    if env:
        await tool("buildah", "config", *[a for e in env for a in ("--env", e)], container)


async def add_label(container: str, key: str, value: str) -> None:
    await tool("buildah", "config", "--label", f"{key}={value}", container)


async def commit(container: str, image: str) -> str:
    """Commit the container's changes as one new layer on its image; the new image's id."""
    return (await tool("buildah", "commit", "--quiet", container, image)).strip().splitlines()[-1]


async def run(container: str, argv: list[str], *, env: list[str], mounts: list[Mount],
              on_line: Callable[[str], Awaitable[None]], timeout: float) -> int:
    """`buildah run` with the host's network: each output line (stdout and stderr merged) goes to
    `on_line` as it comes; the command's exit code (None: killed after `timeout`, as -9)."""
    cmd = ["buildah", "run", "--network", "host", *[a for e in env for a in ("--env", e)],
           *[a for m in mounts for a in ("-v", m.flag())], container, "--", *argv]
    proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.DEVNULL, limit=LINE_LIMIT,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert proc.stdout is not None

    async def pump() -> None:
        assert proc.stdout is not None
        while True:
            try:
                raw = await proc.stdout.readline()
            except ValueError:  # longer than LINE_LIMIT: take what is buffered as one line
                raw = await proc.stdout.read(LINE_LIMIT)
            if not raw:
                return
            await on_line(raw.decode(errors="replace").rstrip("\r\n").rsplit("\r", 1)[-1])

    try:
        await asyncio.wait_for(pump(), timeout)
        return await proc.wait()
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return -9
    finally:
        if proc.returncode is None:  # cancelled: the step's process must not outlive the build
            proc.kill()
            await proc.wait()


# ---- images and registries --------------------------------------------------------------------------

async def push(image: str, destination: str, digest_file: Path) -> str:
    """Push a local image to `destination` (registry/repo:tag); the manifest digest pushed."""
    await tool("buildah", "push", "--quiet", *tls_flags(destination), "--digestfile", str(digest_file),
               image, f"docker://{destination}")
    return digest_file.read_text().strip()


async def image_labels(image: str) -> dict[str, str] | None:
    """The labels of a local image, None when there is no such image."""
    out = await tool("buildah", "inspect", "--type", "image", image, check=False)
    try:
        info = json.loads(out)
    except ValueError:
        return None
    return dict((info.get("OCIv1") or {}).get("config", {}).get("Labels") or {})


async def exists_remote(reference: str) -> bool:
    """Whether `reference` (registry/repo:tag) is in its registry: a manifest answers."""
    proc = await asyncio.create_subprocess_exec(
        "skopeo", "inspect", "--raw", *tls_flags(reference), f"docker://{reference}",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode == 0:
        return True
    text = err.decode(errors="replace").lower()
    if "manifest unknown" in text or "not found" in text or "name unknown" in text:
        return False
    raise ToolError(["skopeo", "inspect", reference], proc.returncode, text)


async def copy_tree(source: Path, target: Path) -> None:
    """`cp -a` of a tree's contents (ownership, modes, links, device nodes kept)."""
    await tool("cp", "-a", "--", f"{os.fspath(source)}/.", os.fspath(target))
