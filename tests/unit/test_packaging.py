"""The wheel carries the whole platform: every module of every folder that pyproject.toml maps onto an
import name, and every non-Python file beside them (protos, .pyi stubs, ...). The editable install
maps whole folders and would hide a package or data file missing from the wheel (setup.py says how
packages are discovered).

The wheel is built from a copy of the tree, as `pip wheel --no-deps --no-build-isolation` (offline:
the venv's own setuptools), so the working tree gets no build/ or egg-info of ours."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("sdk", "libs", "services")
NOT_SOURCE = {"__pycache__", "node_modules"}  # caches and a web app's build dependencies, never shipped


def mapping() -> dict[str, str]:
    """[tool.setuptools.package-dir]: import name -> folder, relative to ROOT."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def source_files(root: Path) -> list[str]:
    """Every file under SOURCE_DIRS of `root`, relative to it, hidden entries and NOT_SOURCE aside; of
    a web app (a folder with a package.json) only its built export `out/` (setup.py says why)."""
    found = []
    for top in SOURCE_DIRS:
        for d, subdirs, files in os.walk(root / top):
            if (Path(d) / "package.json").exists():
                subdirs[:], files = (["out"] if "out" in subdirs else []), []
            subdirs[:] = [s for s in subdirs if s not in NOT_SOURCE and not s.startswith(".")]
            found += [Path(d, f).relative_to(root).as_posix() for f in files
                      if not f.startswith(".") and not f.endswith((".pyc", ".pyo"))]
    return found


def web_app_source(path: str) -> bool:
    """A file of a web app's sources (under a folder with a package.json, outside its `out/`)."""
    for folder in (ROOT / path).parents:
        if (folder / "package.json").exists():
            return not (ROOT / path).is_relative_to(folder / "out")
    return False


def in_wheel(path: str) -> str:
    """Where the file at `path` (relative to the repository) lands in the wheel, by the mapping; the
    longest mapped folder that holds it wins. AssertionError when no mapped folder holds it."""
    owners = [(folder, name) for name, folder in mapping().items() if path.startswith(folder.rstrip("/") + "/")]
    assert owners, f"{path} is under no folder of [tool.setuptools.package-dir]: it would not be installed"
    folder, name = max(owners, key=lambda o: len(o[0]))
    return "/".join([*name.split("."), path[len(folder.rstrip("/")) + 1:]])


def module_name(wheel_path: str) -> str:
    return wheel_path.removesuffix(".py").replace("/", ".")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[str]]:
    """(the copied tree, the names in its wheel)."""
    tmp = tmp_path_factory.mktemp("packaging")
    tree = tmp / "tree"
    tree.mkdir()
    for f in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / f, tree / f)
    for top in SOURCE_DIRS:
        shutil.copytree(ROOT / top, tree / top, ignore=shutil.ignore_patterns(*NOT_SOURCE, "*.pyc"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp / "dist"), str(tree)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [wheel] = (tmp / "dist").glob("levers9-*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp / "unpacked")
        return tree, z.namelist()


def test_the_wheel_holds_every_module_data_file_and_the_cli(built, tmp_path):
    tree, names = built
    files = source_files(tree)
    package_files = [n for n in names if ".dist-info/" not in n]

    # every .py under sdk/, libs/, services/ by its import name, and nothing else
    expected = {module_name(in_wheel(f)) for f in files if f.endswith(".py")}
    shipped = {module_name(n) for n in package_files if n.endswith(".py")}
    assert shipped == expected, f"missing: {sorted(expected - shipped)}; extra: {sorted(shipped - expected)}"
    for sub in ("levers9.runner", "levers9.executor", "levers9.catalogue", "levers9.stack"):
        assert f"{sub}.__init__" in shipped

    # every other file there is read at run time (or may be): all of them ship, tracked ones included
    data = {in_wheel(f) for f in files if not f.endswith(".py")}
    assert {n for n in package_files if not n.endswith(".py")} == data
    tracked = subprocess.run(["git", "ls-files", "--", *SOURCE_DIRS], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode == 0:  # a git checkout (CI's is)
        runtime_files = [f for f in tracked.stdout.splitlines() if not f.endswith(".py") and (ROOT / f).exists()
                         and not web_app_source(f)]
        assert "libs/contracts/proto/functions.proto" in runtime_files
        assert not {in_wheel(f) for f in runtime_files} - set(package_files)

    # the CLI is a console script, and the sandboxes' packages import from the wheel alone
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "levers9 = levers9.cli:main" in (tree.parent / "unpacked" / entry).read_text()
    code = ("import levers9, levers9.runner, levers9.executor, levers9.catalogue, levers9.contracts.proto; "
            "print(levers9.__file__)")
    env = {**os.environ, "PYTHONPATH": str(tree.parent / "unpacked")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tree.parent / "unpacked" / "levers9" / "__init__.py")
