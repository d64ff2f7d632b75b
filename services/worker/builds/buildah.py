"""A thin async wrapper of the buildah and skopeo CLIs (Debian's), as the builder uses them.

Every call raises `ToolError` with the command and its output when the tool exits non-zero, except
`run`, whose exit code is the build step's result. A step runs in a network namespace the worker
made for it (never the host's: `run_argv`). Registries on loopback speak plain HTTP, so
references to them get `--tls-verify=false` (and only those).

Also what a `buildah run` must see of the host for pip inside it to install from where pip on this
host installs from (pip_mounts, pure; host_pip_mounts reads this host's files).
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Awaitable, Callable, Mapping
from urllib.parse import unquote, urlsplit

import psutil

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


def run_argv(container: str, argv: list[str], *, netns: Path, env: list[str], mounts: list[Mount]) -> list[str]:
    """The `buildah run` command of a step (pure): in the network namespace `netns` (never the
    host's), the step's environment and read-only mounts, its argv after `--` (never read as
    buildah's options)."""
    if not netns.is_absolute():
        raise ValueError(f"a step's network namespace must be an absolute path, not {netns}")
    return ["buildah", "run", "--network", f"ns:{netns}", *[a for e in env for a in ("--env", e)],
            *[a for m in mounts for a in ("-v", m.flag())], container, "--", *argv]


async def run(container: str, argv: list[str], *, netns: Path, env: list[str], mounts: list[Mount],
              on_line: Callable[[str], Awaitable[None]], timeout: float) -> int:
    """`buildah run` in the network namespace `netns` (its own, levers9.worker.network.egress_proxy.lane):
    each output line (stdout and stderr merged) goes to `on_line` as it comes; the command's exit
    code (killed after `timeout`: -9)."""
    cmd = run_argv(container, argv, netns=netns, env=env, mounts=mounts)
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
        await kill_tree(proc)
        return -9
    finally:
        if proc.returncode is None:  # cancelled: the step's processes must not outlive the build
            await kill_tree(proc)


async def kill_tree(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL `buildah run` and everything under it. Killing buildah alone would leave the step
    running: runc's container sits in a session of its own, so neither a signal to buildah nor one
    to its process group reaches it; its processes are still descendants, though."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    with contextlib.suppress(ProcessLookupError):
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


# ---- the host's pip configuration as read-only mounts for `buildah run` (pure, but host_pip_mounts) --

# (where pip reads it on the host, where pip inside the build reads it as root)
PIP_CONFIGS = (("/etc/xdg/pip", "/etc/xdg/pip"), ("/etc/pip.conf", "/etc/pip.conf"),
               ("~/.pip/pip.conf", "/root/.pip/pip.conf"), ("~/.config/pip/pip.conf", "/root/.config/pip/pip.conf"))
INDEX_KEYS = ("index-url", "extra-index-url")  # file:// indexes: the tree around simple/ (its files)
PATH_KEYS = ("find-links", "constraint", "cert", "client-cert")  # a local dir or file, as named


def pip_config_paths(home: Path, env: Mapping[str, str]) -> list[tuple[Path, str]]:
    """Every place pip reads a config from on this host (whether it exists or not), with its place
    inside the build; PIP_CONFIG_FILE keeps its path (the variable is passed on)."""
    found = [(Path(host.replace("~", str(home), 1)), target) for host, target in PIP_CONFIGS]
    if env.get("PIP_CONFIG_FILE"):
        found.append((Path(env["PIP_CONFIG_FILE"]), env["PIP_CONFIG_FILE"]))
    return found


def pip_values(texts: list[str], env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(key, value) of every path-like setting in the config texts and PIP_* variables."""
    found = []
    for text in texts:
        parser = configparser.RawConfigParser()
        with contextlib.suppress(configparser.Error):
            parser.read_string(text)
        for section in parser.sections():
            for key, value in parser.items(section):
                found.append((key.replace("_", "-"), value))
    for name, value in env.items():
        if name.startswith("PIP_"):
            found.append((name[4:].lower().replace("_", "-"), value))
    return [(k, v) for k, v in found if k in INDEX_KEYS + PATH_KEYS]


def local_path(token: str) -> str:
    """The host path a config value names ("" for a remote URL or a relative path)."""
    if token.startswith("file:"):
        return unquote(urlsplit(token).path)
    return token if token.startswith("/") else ""


def pip_mounts(configs: list[tuple[Path, str]], texts: list[str], env: Mapping[str, str],
               exists: Callable[[str], bool]) -> list[Mount]:
    """The read-only mounts that show a build what pip on this host sees: the config files that
    exist, and every local dir or file they (or PIP_*) name, at the same path; nothing twice."""
    mounts = [Mount(str(host), target) for host, target in configs if exists(str(host))]
    for key, value in pip_values(texts, env):
        for token in value.split():
            path = local_path(token)
            if not path:
                continue
            if key in INDEX_KEYS and PurePosixPath(path).name == "simple":
                path = str(PurePosixPath(path).parent)  # its index pages link to ../../files/…
            path = str(PurePosixPath(path))
            if exists(path):
                mounts.append(Mount(path, path))
    return _without_nested(mounts)


def _without_nested(mounts: list[Mount]) -> list[Mount]:
    """Drop duplicates and mounts already visible through another (same path, inside its source)."""
    kept: list[Mount] = []
    for m in sorted(set(mounts), key=lambda m: (m.target.count("/"), m.target, m.source)):
        covered = any(k.source == k.target and m.source == m.target
                      and PurePosixPath(m.target).is_relative_to(k.target) for k in kept)
        if not covered and all(k.target != m.target for k in kept):
            kept.append(m)
    return kept


def pip_env(env: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(env.items()) if k.startswith("PIP_")]


def host_pip_texts(env: Mapping[str, str]) -> list[str]:
    """The text of every pip config file of this host (reads them)."""
    texts = []
    for host, _ in pip_config_paths(Path(env.get("HOME") or Path.home()), env):
        for file in ([*sorted(host.glob("*.conf"))] if host.is_dir() else [host]):
            with contextlib.suppress(OSError):
                texts.append(file.read_text(errors="replace"))
    return texts


def host_pip_mounts(env: Mapping[str, str] | None = None) -> tuple[list[Mount], list[str]]:
    """This host's pip mounts and PIP_* variables (reads the config files)."""
    env = dict(os.environ if env is None else env)
    configs = pip_config_paths(Path(env.get("HOME") or Path.home()), env)
    return pip_mounts(configs, host_pip_texts(env), env, os.path.exists), pip_env(env)
