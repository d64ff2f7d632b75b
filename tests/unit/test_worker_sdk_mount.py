"""Containers mount the SDK alone at /opt/levers9: never a venv's site-packages, never the services."""

from __future__ import annotations

import shutil
from pathlib import Path

from levers9.worker.lifecycle import sdk_mount as m


def test_an_editable_installs_sdk_folder_is_mounted_as_it_is(tmp_path):
    # this checkout's own install: sdk/ holds levers9/ and nothing else
    assert m.sdk_mount(tmp_path) == m.package_dir().parent
    assert not (tmp_path / "sdk").exists()


def test_an_installed_wheels_site_packages_is_not_mounted_but_a_copy_of_the_sdk_alone(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    shutil.copytree(m.package_dir(), site / "levers9", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "levers9" / "worker").mkdir()
    (site / "levers9" / "worker" / "__init__.py").write_text("")
    (site / "yaml").mkdir()
    monkeypatch.setattr(m, "package_dir", lambda: site / "levers9")
    home = tmp_path / "home"

    mounted = m.sdk_mount(home)
    assert mounted.is_relative_to(home) and sorted(p.name for p in mounted.iterdir()) == ["levers9"]
    assert (mounted / "levers9" / "runner").is_dir() and (mounted / "levers9" / "executor").is_dir()
    assert not (mounted / "levers9" / "worker").exists()
    assert m.sdk_mount(home) == mounted  # made once

    (site / "levers9" / "added.py").write_text("X = 1\n")  # a new install: a new copy
    again = m.sdk_mount(home)
    assert again != mounted and (again / "levers9" / "added.py").read_text() == "X = 1\n"


def test_the_mounted_sdk_holds_bytecode_for_each_module(tmp_path, monkeypatch):
    # the mount is read-only in a container: without these a runner compiled its ~60 modules at each start
    import importlib.util

    site = tmp_path / "site-packages"
    shutil.copytree(m.package_dir(), site / "levers9", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "levers9" / "worker").mkdir()
    monkeypatch.setattr(m, "package_dir", lambda: site / "levers9")

    mounted = m.sdk_mount(tmp_path / "home")
    sources = list(mounted.rglob("*.py"))
    assert len(sources) > 20
    missing = [p for p in sources if not Path(importlib.util.cache_from_source(str(p))).is_file()]
    assert not missing, missing[:5]


def test_a_vendored_cloudpickle_holds_bytecode(tmp_path):
    import importlib.util

    from levers9.worker.sandboxes.executor_relay import vendor_dir

    folder = vendor_dir(tmp_path)
    sources = list(folder.rglob("*.py"))
    assert sources and all(Path(importlib.util.cache_from_source(str(p))).is_file() for p in sources)
