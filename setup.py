"""Which packages and data files the `levers9` distribution carries; all other metadata, and the
mapping of import names onto folders, is in pyproject.toml.

Why discovery lives here: the import names are mapped onto several folders
([tool.setuptools.package-dir]: levers9 -> sdk/levers9, levers9.worker -> services/worker, ...).
setuptools (84 here) discovers with [tool.setuptools.packages.find] only below `where` folders and
names what it finds from there: services/ gives `worker`, `pool-controller`, never
`levers9.worker`, and the mapping is not applied. A hand-written `packages` list, the alternative,
silently dropped levers9.runner, levers9.executor and levers9.catalogue from the wheel while the
editable install (which maps whole folders) hid it. So the rule is the one Python's own import
follows in the editable install: under each mapped folder, every folder holding a .py file is a
package (named by the mapping), a new sub-package such as services/worker/runtime/runc/ included;
every other file under a package's folder (protos, .pyi stubs, profiles, schemas, templates, a
built web app, ...) is that package's data. tests/unit/test_packaging.py builds the wheel and
checks both against the tree.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# never packaged: caches, the dependencies of a web app's build, hidden files
SKIP_DIRS = {"__pycache__", "node_modules"}
SKIP_SUFFIXES = (".pyc", ".pyo")


def package_dirs() -> dict[str, str]:
    """[tool.setuptools.package-dir] of pyproject.toml: import name -> folder."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def _walk(folder: Path, other_roots: set[Path]):
    """(dir, files) under folder, skipping SKIP_DIRS, hidden entries and other mapped roots; of a web
    app (a folder with a package.json) only its built export, `out/`, which is what the platform
    serves: its sources, lock file and npm settings are the build's, not the run's."""
    for d, subdirs, files in os.walk(folder):
        if (Path(d) / "package.json").exists():
            subdirs[:] = ["out"] if "out" in subdirs else []
            files = []
        subdirs[:] = sorted(s for s in subdirs if s not in SKIP_DIRS and not s.startswith(".")
                            and Path(d, s).resolve() not in other_roots)
        yield Path(d), sorted(f for f in files if not f.startswith(".") and not f.endswith(SKIP_SUFFIXES))


def discover(mapping: dict[str, str]) -> tuple[list[str], dict[str, list[str]]]:
    """(packages, package_data) of every mapped folder."""
    roots = {(ROOT / folder).resolve() for folder in mapping.values()}
    packages: list[str] = []
    data: dict[str, list[str]] = {}
    for name, folder in sorted(mapping.items()):
        top = ROOT / folder
        walked = list(_walk(top, roots - {top.resolve()}))
        pkg_dirs = {d: ".".join([name, *d.relative_to(top).parts]) for d, files in walked
                    if d == top or any(f.endswith(".py") for f in files)}
        packages += sorted(pkg_dirs.values())
        for d, files in walked:
            owner = next(p for p in (d, *d.parents) if p in pkg_dirs)  # the nearest package folder
            data.setdefault(pkg_dirs[owner], []).extend(
                (d / f).relative_to(owner).as_posix() for f in files if not f.endswith(".py"))
    return packages, {k: v for k, v in data.items() if v}


class FreshBuildPy(build_py):
    """build_py into an emptied folder: setuptools otherwise keeps build/lib from an earlier build in
    the same tree, and a module moved or deleted since then would still ship in the wheel (seen)."""

    def run(self) -> None:
        shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()


packages, package_data = discover(package_dirs())
setup(packages=packages, package_data=package_data, cmdclass={"build_py": FreshBuildPy})
