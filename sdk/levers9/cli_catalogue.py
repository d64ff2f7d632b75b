"""`levers9 catalogue build|show`: shared pre-import checkpoints (levers9.catalogue).

build: corpus -> analysis -> measurements (in the flavor's image, through the platform's own
functions) -> groups -> capture (one sandbox per set, imported and dumped) -> catalogue, each stage's
output kept in the work directory and skipped when up to date (an interrupted build resumes); then
the catalogue is published (stored in S3, announced to the scheduler and the workers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from levers9.cli_output import JSON_OPTION, console, errors, fail

catalogue_app = typer.Typer(help="Shared pre-import checkpoints: build and show the catalogue.", no_args_is_help=True)


# The platform base is Debian 12, whose python3-* packages are built against numpy 1.24. A candidate
# that pulls numpy 2 from PyPI (matplotlib >= 3.10 does) breaks those in place, so the flavor's
# image asks for versions newer than Debian's of the compiled ones: wheels built for numpy 2.
NEWER_THAN_DEBIAN = {"pandas": "pandas>=2.2", "scikit-learn": "scikit-learn>=1.5", "scipy": "scipy>=1.13",
                     "matplotlib": "matplotlib>=3.9", "numpy": "numpy>=2"}


def requirements(names: list[str]) -> list[str]:
    return sorted(NEWER_THAN_DEBIAN.get(n, n) for n in names)


def has_wheel(requirement: str) -> str:
    """"" when pip finds a binary wheel of `requirement` for this Python and platform (the sandboxes'),
    else why not: a candidate that would compile from source is left out of the flavor's image rather
    than fail its build."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                               "--only-binary=:all:", "--no-deps", "-d", tmp, requirement],
                              capture_output=True, text=True, timeout=300)
    return "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["no wheel"])[-1]


def hooks(modules: dict[str, list[str]], flavor: str, repeats: int, exclude: set[str]) -> Any:
    """The pipeline's platform stages: measure in, and capture from, the flavor's image (one image
    holding every measured candidate)."""
    from levers9 import Image
    from levers9.catalogue import platform_stages as ps
    from levers9.catalogue.pipeline import Hooks
    from levers9.contracts import uuid7

    chosen: dict[str, Any] = {}

    def say(line: str) -> None:
        console.print(line)

    def measure(names: list[str]) -> list[Any]:
        names = [n for n in names if n not in exclude]
        why = {n: has_wheel(NEWER_THAN_DEBIAN.get(n, n)) for n in names}
        for n, reason in why.items():
            if reason:
                say(f"  {n}: left out of the image (no binary wheel for this platform: {reason})")
        names = [n for n in names if not why[n]]
        chosen["image"] = Image(python_packages=requirements(names))
        return ps.measure(chosen["image"], [(n, modules.get(n) or [n.replace("-", "_")]) for n in names], repeats, say)

    def capture(sets: list[list[str]]) -> list[Any]:
        timings = {t.distribution: t for t in chosen.get("timings", [])}
        image = chosen.get("image") or Image(python_packages=requirements(sorted({d for s in sets for d in s})))
        packaged = [[timings[d] for d in s if d in timings] for s in sets]
        return ps.capture(image, image.id, flavor, packaged, uuid7(), say)

    return Hooks(measure=measure, capture=capture), chosen


@catalogue_app.command()
def build(corpus: list[Path] = typer.Option([], "--corpus", help="a directory of .py files to add (repeatable)"),
          flavor: str = typer.Option("cpu", help="cpu or gpu"),
          max_checkpoints: int = typer.Option(4, help="at most this many shared checkpoints"),
          memory_budget_mib: float = typer.Option(4096, help="their memory, all together"),
          holdout: float = typer.Option(0.2, help="the fraction of the corpus set aside for the benchmark"),
          top: int = typer.Option(12, help="the most imported distributions measured"),
          exclude: list[str] = typer.Option([], "--exclude", help="a distribution never to measure (repeatable)"),
          no_default_corpus: bool = typer.Option(False, help="only --corpus directories"),
          work_dir: Optional[Path] = typer.Option(None, help="where each stage's output is kept"),
          repeats: int = typer.Option(3, help="fresh interpreters per import timing (at least 3)"),
          publish: bool = typer.Option(True, help="publish the catalogue when built"),
          json_out: bool = JSON_OPTION) -> None:
    """Analyse the corpus, measure, group, capture and publish a catalogue (resumable)."""
    from levers9.catalogue import grouping
    from levers9.catalogue.pipeline import PipelineConfig, run
    from levers9.client import Client
    from levers9.contracts.catalogue import encode_catalogue

    if repeats < 3:
        fail("--repeats must be at least 3 (the median of fresh interpreters)")
    config = PipelineConfig(flavor=flavor, work_dir=str(work_dir or ""), default_corpus=not no_default_corpus,  # type: ignore[arg-type]
                            corpus_dirs=[str(p) for p in corpus], holdout=holdout, top_n=top,
                            grouping=grouping.GroupingConfig(max_sets=max_checkpoints,
                                                             memory_budget_mib=memory_budget_mib))
    with errors():
        analysed = run(config, until="analysis", console=console)["analysis"]
        modules = {f.distribution: list(f.modules) for f in analysed.frequency}
        hook, chosen = hooks(modules, flavor, repeats, set(exclude))
        measured = run(config, hook, until="measurements", console=console)["measurements"]
        chosen["timings"] = measured
        results = run(config, hook, console=console)
        cat = results["catalogue"]
        answer = Client.from_profile().publish_catalogue(encode_catalogue(cat)) if publish else {}
    if json_out:
        print(json.dumps({"catalogue_id": cat.catalogue_id, "published": answer,
                          "scores": {k: {"held_out_seconds": v.held_out_seconds, "memory_mib": v.memory_mib}
                                     for k, v in results["groups"].scores.items()}}))
        return
    console.print(f"catalogue {cat.catalogue_id}: {len(cat.checkpoints)} shared checkpoints"
                  + (" (published)" if answer else ""))


@catalogue_app.command()
def show(flavor: str = typer.Option("cpu", help="cpu or gpu"), json_out: bool = JSON_OPTION) -> None:
    """The newest published catalogue of a flavor."""
    from levers9.client import Client

    with errors():
        doc = Client.from_profile().catalogue(flavor)
    if json_out:
        print(json.dumps(doc))
        return
    console.print(f"catalogue {doc['catalogue_id']} ({doc['flavor']}), image {doc['image_id']}, "
                  f"corpus {doc.get('corpus')}")
    table = Table("checkpoint", "packages", "saves", "memory", "restore", "python", "cpu features")
    for c in doc["checkpoints"]:
        table.add_row(c["checkpoint_id"], ", ".join(f"{p['distribution']} {p['version']}" for p in c["packages"]),
                      f"{c['saves_seconds'] * 1000:.0f} ms", f"{c['memory_mib']:.0f} MiB",
                      f"{c['restore_seconds'] * 1000:.0f} ms", c["settings"]["python"],
                      " ".join(c["settings"]["cpu_features"]))
    console.print(table)
