"""levers9 installed from its wheel, not editable, end to end: a platform team's install. The wheel is
built from a copy of the checkout and installed into a fresh venv outside it; from that venv, with its
cwd outside the checkout and nothing of the checkout on PYTHONPATH or PATH, `levers9 up` starts a
stack, an endpoint app is deployed and called, a user's script calls a function with `.remote`, and
`levers9 down` leaves nothing. The sandboxes must run the installed package: the worker mounts the
folder that holds its own `levers9` package into them.

What the wheel is built from: the files git would put in a commit of the working tree, tracked or new
(`git ls-files --cached --others --exclude-standard`), never ignored ones (build/, *.egg-info,
__pycache__, .venv): those are what leaked into wheels before. A fresh clone (CI) is exactly HEAD; a
developer's run tests their working tree, as the editable tests beside it do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from _e2e import api, cli, needs_runc, one_worker_stack
from _faults import Node

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PACKAGED = ("pyproject.toml", "setup.py", "README.md", "sdk", "libs", "services")
MARKER = "WHEEL_E2E_MARKER"  # a data file only the wheel's levers9 package holds: the checkout has none

needs_runc()

ENDPOINT_APP = '''"""Says which levers9 its sandbox imports, and whether a package of the host's venv shows."""
import os

from levers9 import App

app = App("wheel-where")


@app.endpoint(cpu=0.25, memory="128Mi", keep_warm_seconds=30)
def where(echo: str = ""):
    import levers9

    here = os.path.dirname(levers9.__file__)
    try:
        import yaml  # noqa: F401 - in the host's venv (a dependency of levers9), not in the image
        host_package = True
    except ImportError:
        host_package = False
    return {"echo": echo, "levers9": here, "host_package": host_package, "from_wheel": os.path.exists(os.path.join(here, "%s")),
            "container_id": os.environ.get("LEVERS9_CONTAINER_ID", "")}
''' % MARKER

FUNCTION_SCRIPT = '''"""A user's script: a function of its __main__ called remotely, no deploy step."""
import json
import os

from levers9 import App

app = App("wheel-fn")


@app.function(cpu=0.5, memory="256Mi")
def square(x):
    import levers9

    here = os.path.dirname(levers9.__file__)
    return {"square": x * x, "from_wheel": os.path.exists(os.path.join(here, "%s"))}


if __name__ == "__main__":
    import levers9

    print("CALLER " + levers9.__file__, flush=True)
    print("RESULT " + json.dumps(square.remote(7)), flush=True)
''' % MARKER


def copy_checkout(dst: Path) -> Path:
    """The packaged files of the working tree that git would commit (see the module's docstring)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *PACKAGED],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():  # a tracked file deleted in the working tree is not committed either
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    (dst / "sdk" / "levers9" / MARKER).write_text("built by tests/e2e/test_e2e_wheel.py\n")
    return dst


def clean_env(venv: Path) -> dict:
    """This process's environment without the checkout: no PYTHONPATH, no venv of it, its bin first."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("LEVERS9_")}
    path = [p for p in env.get("PATH", "").split(":") if p and not Path(p).resolve().is_relative_to(ROOT)]
    env.update(PATH=":".join([str(venv / "bin"), *path]), VIRTUAL_ENV=str(venv))
    return env


def timed(what: str, argv: list[str], timings: dict, **kw) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    timings[what] = round(time.monotonic() - t0, 1)
    assert proc.returncode == 0, f"{what}: {proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """{"python", "env", "work"}: the venv's interpreter, its clean environment, a folder outside the
    checkout to run in. Prints how long the build and the install took."""
    tmp = tmp_path_factory.mktemp("l9wheel")
    assert not tmp.resolve().is_relative_to(ROOT)
    timings: dict = {}
    tree = copy_checkout(tmp / "src")
    # the venv's own setuptools, no index: offline
    timed("wheel", [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp / "dist"), str(tree)], timings, timeout=300)
    [wheel] = (tmp / "dist").glob("levers9-*.whl")
    shutil.rmtree(tree)  # nothing may come from the copy either
    venv = tmp / "venv"
    env = clean_env(venv)
    # a clean venv (no system or checkout site-packages); dependencies from pip's configured indexes
    # and find-links, through its cache
    timed("venv", [sys.executable, "-m", "venv", str(venv)], timings, cwd=tmp, env=env, timeout=300)
    timed("install", [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], timings,
          cwd=tmp, env=env, timeout=900)
    print(f"wheel e2e timings (s): {timings}", flush=True)
    (tmp / "work").mkdir()
    return {"python": str(venv / "bin" / "python"), "env": env, "work": tmp / "work", "venv": venv}


@pytest.fixture(scope="module")
def stack(installed, tmp_path_factory):
    home = tmp_path_factory.mktemp("l9wheelhome")
    with one_worker_stack(home, 2000, 2048, python=installed["python"], base_env=installed["env"],
                          cwd=installed["work"]) as env:
        yield env


def run_py(installed: dict, env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([installed["python"], *args], env=env, cwd=installed["work"], capture_output=True,
                          text=True, timeout=timeout)


def test_the_venv_imports_every_package_from_its_wheel(installed):
    code = ("import levers9, levers9.runner, levers9.executor, levers9.catalogue, levers9.contracts.proto, "
            "levers9.worker.service, levers9.cli; print(levers9.__file__)")
    proc = run_py(installed, installed["env"], "-c", code)
    assert proc.returncode == 0, proc.stderr
    where = Path(proc.stdout.strip())
    assert where.is_relative_to(installed["venv"]) and (where.parent / MARKER).exists(), where
    assert not where.resolve().is_relative_to(ROOT)
    assert shutil.which("levers9", path=installed["env"]["PATH"]) == str(installed["venv"] / "bin" / "levers9")


@pytest.fixture(scope="module")
def where(installed, stack) -> dict:
    """What the deployed endpoint app answered from its sandbox."""
    app = installed["work"] / "where.py"
    app.write_text(ENDPOINT_APP)
    cli(stack, "deploy", str(app), python=installed["python"], cwd=installed["work"])
    r = api(stack, "POST", "/endpoint/where", json={"echo": "wheel"})
    assert r.status_code == 200, r.text
    return r.json()


def test_an_endpoint_deploys_and_answers_from_the_installed_package(where):
    assert where["echo"] == "wheel" and where["container_id"]
    assert where["from_wheel"], f"the sandbox's levers9 ({where['levers9']}) is not the installed one"


def test_the_sandbox_sees_no_package_of_the_platforms_venv(where):
    assert where["host_package"] is False


def test_a_script_calls_a_function_with_remote(installed, stack):
    script = installed["work"] / "square.py"
    script.write_text(FUNCTION_SCRIPT)
    proc = run_py(installed, stack, str(script))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    caller = next(ln for ln in lines if ln.startswith("CALLER "))[len("CALLER "):]
    assert Path(caller).is_relative_to(installed["venv"])
    result = json.loads(next(ln for ln in lines if ln.startswith("RESULT "))[len("RESULT "):])
    assert result == {"square": 49, "from_wheel": True}


def test_down_leaves_nothing(installed, stack):
    """Last in the module: no process of the venv or the home, no container, veth, namespace or mount."""
    home = Path(stack["LEVERS9_HOME"])
    ids = {c["container_id"] for c in api(stack, "GET", "/api/v1/containers", params={"all": "true"}).json()}
    assert Node.of(home, ids).runc, "the stack ran no container: the check below would prove nothing"
    cli(stack, "down", python=installed["python"], cwd=installed["work"])
    after = Node.of(home, ids)
    assert after.runc == {} and not after.veths and not after.namespaces and not after.mounts, after
    assert processes_of(installed["venv"], home) == []


def processes_of(venv: Path, home: Path) -> list[str]:
    out = []
    for p in psutil.process_iter(["cmdline", "environ", "exe"]):
        try:
            text = " ".join([p.info["exe"] or "", *(p.info["cmdline"] or [])])
            env = p.info["environ"] or {}
        except psutil.Error:
            continue
        if p.pid != os.getpid() and (str(venv) in text or str(home) in text or env.get("LEVERS9_HOME") == str(home)):
            out.append(f"{p.pid} {text}")
    return out
