"""`levers9 catalogue build` as resumable stages: corpus, analysis, measurements, groups, capture, catalogue.

Each stage writes its result to <work dir>/<stage>.json (default work dir $LEVERS9_HOME/catalogue/<flavor>)
as {"stage", "input_hash", "result"}, the input hash covering its settings and its upstream results.
A stage whose file exists with the same input hash is skipped and its result loaded, so a build that
failed at the capture resumes there. Measuring import times and capturing checkpoints need the
running platform: they are hooks the caller passes (`Hooks.measure`, `Hooks.capture`); a stage that
needs a missing hook raises HookMissing, unless its output is already there and up to date.

The grouping is chosen on the training files and judged on the held-out ones, against the two
baselines (one checkpoint with everything, none), so groups.json carries the benchmark's numbers.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from levers9.catalogue import analysis as an
from levers9.catalogue import corpus as cp
from levers9.catalogue import grouping as gr
from levers9.contracts.catalogue import Catalogue, Flavor, PackageTiming, SharedCheckpoint
from levers9.contracts.ids import uuid7
from levers9.runtime.config import default_home

MeasureHook = Callable[[list[str]], list[PackageTiming]]
CaptureHook = Callable[[list[list[str]]], list[SharedCheckpoint]]


class PipelineError(RuntimeError):
    pass


class HookMissing(PipelineError):
    """A stage needs the running platform and no hook for it was given."""


class PipelineConfig(msgspec.Struct, frozen=True, kw_only=True):
    flavor: Flavor = "cpu"
    work_dir: str = ""  # default $LEVERS9_HOME/catalogue/<flavor>
    cache_dir: str = ""  # default corpus.default_cache_dir()
    default_corpus: bool = True  # the scikit-learn and networkx examples
    corpus_dirs: list[str] = []  # added with --corpus DIR
    holdout: float = 0.2
    top_n: int = 20  # distributions measured
    grouping: gr.GroupingConfig = gr.GroupingConfig()

    def work_path(self) -> Path:
        return Path(self.work_dir).expanduser() if self.work_dir else default_home() / "catalogue" / self.flavor

    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else cp.default_cache_dir()


@dataclass
class Hooks:
    measure: MeasureHook | None = None  # candidates -> one PackageTiming each that could be measured
    capture: CaptureHook | None = None  # package sets -> one SharedCheckpoint each
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))


class CorpusResult(msgspec.Struct, frozen=True, kw_only=True):
    dirs: list[cp.CorpusDir]
    counts: dict[str, int]  # corpus name -> .py files
    train: list[str]
    held_out: list[str]


class Score(msgspec.Struct, frozen=True, kw_only=True):
    sets: list[list[str]]
    memory_mib: float
    train_seconds: float  # mean import seconds saved per call, training files
    held_out_seconds: float  # the same on the held-out files: the benchmark's number


class GroupsResult(msgspec.Struct, frozen=True, kw_only=True):
    config: gr.GroupingConfig
    sets: list[list[str]]  # the greedy choice, most valuable first: what is captured
    scores: dict[str, Score]  # "greedy", "one_with_everything", "none"


class StageLine:
    """One stage's progress line (a no-op without a live display)."""

    def __init__(self, progress: Progress | None, name: str) -> None:
        self._progress, self.name = progress, name
        self._task = progress.add_task(name, total=None) if progress is not None else None

    def update(self, done: int, note: str = "", total: int | None = None) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=done, total=total,
                                  description=f"{self.name}: {note}" if note else self.name)

    def finish(self, note: str) -> None:
        if self._progress is not None and self._task is not None:
            done = max(int(self._progress.tasks[self._task].completed), 1)
            self.update(done, note, total=done)


@dataclass
class Reporter:
    """A rich progress line per stage; the analysis stage counts files."""
    console: Console = field(default_factory=Console)
    _progress: Progress | None = None

    @contextmanager
    def live(self) -> Iterator[None]:
        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=self.console) as progress:
            self._progress = progress
            try:
                yield
            finally:
                self._progress = None

    def start(self, stage: str) -> StageLine:
        return StageLine(self._progress, stage)


@dataclass
class Context:
    config: PipelineConfig
    hooks: Hooks
    reporter: Reporter
    results: dict[str, Any] = field(default_factory=dict)


class Stage(Protocol):
    name: ClassVar[str]  # also its file: <name>.json
    result_type: ClassVar[Any]  # what the file's "result" decodes to

    def input_hash(self, ctx: Context) -> str: ...

    def run(self, ctx: Context, line: StageLine) -> Any: ...


def digest(*parts: Any) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(msgspec.json.encode(part, order="deterministic"))
        h.update(b"\0")
    return h.hexdigest()[:32]


class CorpusStage:
    name: ClassVar[str] = "corpus"
    result_type: ClassVar[Any] = CorpusResult

    def input_hash(self, ctx: Context) -> str:
        c = ctx.config
        local = [_listing(Path(d)) for d in c.corpus_dirs]  # an added file there redoes the build
        return digest(c.default_corpus, str(c.cache_path()), c.corpus_dirs, c.holdout, local)

    def run(self, ctx: Context, line: StageLine) -> CorpusResult:
        c = ctx.config
        dirs = cp.fetch_default(c.cache_path(), lambda msg: line.update(0, msg)) if c.default_corpus else []
        dirs += [cp.local_dir(Path(d)) for d in c.corpus_dirs]
        if not dirs:
            raise PipelineError("no corpus: keep the default one or add a directory with --corpus DIR")
        counts = {d.name: len(cp.files([d])) for d in dirs}
        roots = [Path(d.path).resolve() for d in dirs]
        train, held = cp.split(cp.files(dirs), c.holdout, roots)
        return CorpusResult(dirs=dirs, counts=counts, train=[str(p) for p in train], held_out=[str(p) for p in held])


class AnalysisStage:
    name: ClassVar[str] = "analysis"
    result_type: ClassVar[Any] = an.Analysis

    def input_hash(self, ctx: Context) -> str:
        return digest(ctx.results["corpus"], an.ANALYSIS_VERSION, an.installed_mapping())

    def run(self, ctx: Context, line: StageLine) -> an.Analysis:
        corpus: CorpusResult = ctx.results["corpus"]
        paths = [Path(p) for p in sorted(corpus.train + corpus.held_out)]
        result = an.analyse(paths, on_file=lambda n: line.update(n, "files", total=len(paths)))
        line.update(len(paths), f"{result.parsed} files parsed, {result.syntax_errors} syntax errors, "
                                f"{result.decode_errors} decode errors", total=len(paths))
        return result


class MeasureStage:
    name: ClassVar[str] = "measurements"
    result_type: ClassVar[Any] = list[PackageTiming]

    def input_hash(self, ctx: Context) -> str:
        return digest(ctx.config.flavor, measurement_candidates(ctx))

    def run(self, ctx: Context, line: StageLine) -> list[PackageTiming]:
        if ctx.hooks.measure is None:
            raise HookMissing("measuring import times needs the running platform: pass Hooks.measure "
                              "(candidates -> list[PackageTiming]), or run the pipeline until 'analysis'")
        timings = ctx.hooks.measure(measurement_candidates(ctx))
        return with_frequencies(timings, ctx.results["analysis"])


class GroupsStage:
    name: ClassVar[str] = "groups"
    result_type: ClassVar[Any] = GroupsResult

    def input_hash(self, ctx: Context) -> str:
        return digest(ctx.results["corpus"], ctx.results["analysis"], ctx.results["measurements"],
                      ctx.config.grouping)

    def run(self, ctx: Context, line: StageLine) -> GroupsResult:
        corpus: CorpusResult = ctx.results["corpus"]
        analysis: an.Analysis = ctx.results["analysis"]
        timings: list[PackageTiming] = ctx.results["measurements"]
        train, held = an.calls_of(analysis, corpus.train), an.calls_of(analysis, corpus.held_out)
        cfg = ctx.config.grouping
        choices = {"greedy": gr.group(train, timings, cfg),
                   "one_with_everything": gr.one_with_everything(train, timings, cfg),
                   "none": gr.none()}
        scores = {name: Score(sets=[sorted(s) for s in sets], memory_mib=gr.memory_mib(sets, timings, cfg.base_mib),
                              train_seconds=gr.expected_saving(sets, train, timings),
                              held_out_seconds=gr.expected_saving(sets, held, timings))
                  for name, sets in choices.items()}
        return GroupsResult(config=cfg, sets=scores["greedy"].sets, scores=scores)


class CaptureStage:
    name: ClassVar[str] = "capture"
    result_type: ClassVar[Any] = list[SharedCheckpoint]

    def input_hash(self, ctx: Context) -> str:
        return digest(ctx.config.flavor, ctx.results["groups"].sets, ctx.results["measurements"])

    def run(self, ctx: Context, line: StageLine) -> list[SharedCheckpoint]:
        sets: list[list[str]] = ctx.results["groups"].sets
        if not sets:
            return []
        if ctx.hooks.capture is None:
            raise HookMissing("capturing checkpoints needs the running platform: pass Hooks.capture "
                              "(package sets -> list[SharedCheckpoint]), or run the pipeline until 'groups'")
        return ctx.hooks.capture(sets)


class CatalogueStage:
    name: ClassVar[str] = "catalogue"
    result_type: ClassVar[Any] = Catalogue

    def input_hash(self, ctx: Context) -> str:
        r = ctx.results
        return digest(ctx.config.flavor, ctx.config.grouping, r["corpus"].counts, r["measurements"], r["capture"])

    def run(self, ctx: Context, line: StageLine) -> Catalogue:
        checkpoints: list[SharedCheckpoint] = ctx.results["capture"]
        corpus: CorpusResult = ctx.results["corpus"]
        return Catalogue(catalogue_id=uuid7(), flavor=ctx.config.flavor,
                         image_id=checkpoints[0].image_id if checkpoints else "",
                         created_at=ctx.hooks.now().isoformat(timespec="seconds"), corpus=dict(corpus.counts),
                         packages=list(ctx.results["measurements"]), checkpoints=checkpoints,
                         memory_budget_mib=ctx.config.grouping.memory_budget_mib)


STAGES: tuple[Stage, ...] = (CorpusStage(), AnalysisStage(), MeasureStage(), GroupsStage(), CaptureStage(),
                             CatalogueStage())
STAGE_NAMES = tuple(s.name for s in STAGES)


def measurement_candidates(ctx: Context) -> list[str]:
    """The top N distributions by the training files (held-out files do not choose what is measured)."""
    corpus: CorpusResult = ctx.results["corpus"]
    return an.top_distributions(an.calls_of(ctx.results["analysis"], corpus.train), ctx.config.top_n)


def with_frequencies(timings: list[PackageTiming], analysis: an.Analysis) -> list[PackageTiming]:
    """The hook's timings with the corpus share and import names filled in from the analysis."""
    freq = {f.distribution: f for f in analysis.frequency}
    out = []
    for t in timings:
        f = freq.get(an.normalise(t.distribution))
        if f is not None:
            t = msgspec.structs.replace(t, frequency=f.share, modules=t.modules or f.modules)
        out.append(t)
    return out


def run(config: PipelineConfig, hooks: Hooks | None = None, until: str = "catalogue",
        console: Console | None = None) -> dict[str, Any]:
    """Run (or resume) the stages up to and including `until`; returns each stage's result by name."""
    if until not in STAGE_NAMES:
        raise PipelineError(f"no stage {until!r}: one of {', '.join(STAGE_NAMES)}")
    ctx = Context(config=config, hooks=hooks or Hooks(), reporter=Reporter(console or Console()))
    work = config.work_path()
    work.mkdir(parents=True, exist_ok=True)
    with ctx.reporter.live():
        for stage in STAGES:
            ctx.results[stage.name] = run_stage(stage, ctx, work)
            if stage.name == until:
                break
    return ctx.results


def run_stage(stage: Stage, ctx: Context, work: Path) -> Any:
    """Load the stage's output when its input hash matches, else run it and write the output."""
    path = work / f"{stage.name}.json"
    wanted = stage.input_hash(ctx)
    cached = _load(path, stage, wanted)
    line = ctx.reporter.start(stage.name)
    if cached is not None:
        line.finish("up to date, skipped")
        return cached
    result = stage.run(ctx, line)
    _write(path, {"stage": stage.name, "input_hash": wanted, "result": result})
    line.finish(f"done, {path.name}")
    # What the next run will load (20 read back as 20.0): downstream input hashes must not differ.
    return msgspec.json.decode(msgspec.json.encode(result), type=stage.result_type)


class _Envelope(msgspec.Struct):
    stage: str
    input_hash: str
    result: msgspec.Raw


def _load(path: Path, stage: Stage, wanted: str) -> Any:
    """The stored result if the file is there, well formed, and made from the same inputs; else None."""
    try:
        env = msgspec.json.decode(path.read_bytes(), type=_Envelope)
        if env.stage != stage.name or env.input_hash != wanted:
            return None
        return msgspec.json.decode(env.result, type=stage.result_type)
    except (OSError, msgspec.MsgspecError):
        return None


def _write(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(doc, order="deterministic"), indent=2))
    os.replace(tmp, path)


def _listing(root: Path) -> list[tuple[str, int, int]]:
    if not root.is_dir():
        return []
    return [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*.py")) if p.is_file()]
