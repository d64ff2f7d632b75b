"""The catalogue build's corpus, import analysis and staged pipeline (no platform, no servers)."""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from rich.console import Console

from levers9.catalogue import analysis as an
from levers9.catalogue import corpus as cp
from levers9.catalogue import pipeline as pl
from levers9.contracts.catalogue import PackageTiming, SharedCheckpoint, decode_catalogue

FIXTURE = Path(__file__).parent / "fixtures" / "corpus"


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    """The fixture corpus, with its syntax error as a .py (kept as .py.txt in the repo for ruff)."""
    dest = tmp_path / "corpus"
    shutil.copytree(FIXTURE, dest)
    for txt in dest.rglob("*.py.txt"):
        txt.rename(txt.with_suffix(""))
    (dest / "latin1.py").write_bytes(b"import numpy\nname = '\xe9t\xe9'\n")  # not UTF-8, no coding cookie
    return dest


# --- imports of one file -------------------------------------------------------------------------------

def test_top_level_names_of_every_absolute_import():
    src = ("import a.b.c, d as e\nfrom f.g import h\nfrom . import i\nfrom .j import k\nfrom .. import l\n"
           "def fn():\n    import m\ntry:\n    import n\nexcept ImportError:\n    pass\n")
    assert an.imported_modules(src) == {"a", "d", "f", "m", "n"}


def test_standard_library_and_future_are_not_third_party():
    mods = an.imported_modules("from __future__ import annotations\nimport os, json, numpy, collections.abc\n")
    assert an.third_party(mods) == {"numpy"}


def test_parse_failures_say_which_kind():
    with pytest.raises(an.ParseFailure) as exc:
        an.imported_modules("print 'x'\n")
    assert exc.value.kind == "syntax"
    with pytest.raises(an.ParseFailure) as exc:
        an.imported_modules(b"x = '\xff'\n")
    assert exc.value.kind == "decode"
    with pytest.raises(an.ParseFailure) as exc:
        an.imported_modules(b"x = 1\0\n")
    assert exc.value.kind in ("decode", "syntax")


def test_distribution_names_from_the_table_metadata_or_the_name_itself():
    mapping = an.installed_mapping()
    assert an.distribution_of("sklearn", mapping) == "scikit-learn"
    assert an.distribution_of("PIL", mapping) == "pillow"
    assert an.distribution_of("yaml", mapping) == "pyyaml"  # installed here: from its metadata
    assert an.distribution_of("msgspec", mapping) == "msgspec"
    assert an.distribution_of("Some_Unknown.Thing", {}) == "some-unknown-thing"


# --- the analysis of a corpus ----------------------------------------------------------------------------

def test_analysis_of_the_fixture_corpus(corpus_dir: Path):
    paths = cp.files([cp.local_dir(corpus_dir)])
    seen: list[int] = []
    result = an.analyse(paths, on_file=seen.append)
    assert result.files == len(paths) == 7 and seen[-1] == 7
    assert (result.syntax_errors, result.decode_errors, result.parsed) == (1, 1, 5)
    by_file = {Path(p).name: s for p, s in zip(result.paths, result.per_file, strict=True)}
    assert by_file == {"regression.py": {"numpy", "scikit-learn"}, "plotting.py": {"pandas", "matplotlib"},
                       "lazy_imports.py": {"networkx", "scipy"}, "relative.py": frozenset(),
                       "stdlib_only.py": frozenset()}
    freq = {f.distribution: f for f in result.frequency}
    assert set(freq) == {"numpy", "scikit-learn", "pandas", "matplotlib", "networkx", "scipy"}
    assert freq["matplotlib"].modules == ["matplotlib", "mpl_toolkits"] and freq["matplotlib"].share == 0.2
    assert freq["scikit-learn"].modules == ["sklearn"]


def test_frequency_table_is_most_imported_first_then_by_name():
    sources = [("a.py", b"import numpy, pandas"), ("b.py", b"import numpy"), ("c.py", b"import zzz, aaa")]
    result = an.analyse_sources(sources, {})
    assert [(f.distribution, f.files) for f in result.frequency] == [
        ("numpy", 2), ("aaa", 1), ("pandas", 1), ("zzz", 1)]
    assert an.top_distributions(result.per_file, 2) == ["numpy", "aaa"]
    assert an.calls_of(result, ["c.py", "missing.py", "b.py"]) == [{"aaa", "zzz"}, {"numpy"}]


def test_an_analysis_survives_json():
    result = an.analyse_sources([("a.py", b"import numpy, sklearn")], an.HAND_TABLE)
    back = msgspec.json.decode(msgspec.json.encode(result), type=an.Analysis)
    assert back == result and back.per_file == [frozenset({"numpy", "scikit-learn"})]


# --- corpus files and the held-out split -----------------------------------------------------------------

def test_files_skip_hidden_ones_and_duplicates(tmp_path: Path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("import numpy\n")
    (tmp_path / "a" / ".hidden.py").write_text("")
    (tmp_path / "a" / "notes.txt").write_text("")
    d = cp.local_dir(tmp_path / "a")
    assert cp.files([d, d]) == [(tmp_path / "a" / "x.py").resolve()]
    with pytest.raises(cp.CorpusFetchError):
        cp.local_dir(tmp_path / "missing")


def test_split_is_deterministic_roughly_the_share_and_independent_of_the_location():
    names = [Path(f"dir{i % 7}/example_{i}.py") for i in range(2000)]
    one = [Path("/cache/one") / n for n in names]
    two = [Path("/elsewhere/two") / n for n in names]
    train1, held1 = cp.split(one, 0.2, [Path("/cache/one")])
    train2, held2 = cp.split(two, 0.2, [Path("/elsewhere/two")])
    assert [p.relative_to("/cache/one") for p in held1] == [p.relative_to("/elsewhere/two") for p in held2]
    assert len(train1) + len(held1) == 2000 and 300 < len(held1) < 500
    assert cp.split(one, 0.2, [Path("/cache/one")]) == (train1, held1)
    assert cp.split(one, 0.0) == (one, []) and cp.split(one, 1.0) == ([], one)
    with pytest.raises(ValueError):
        cp.split(one, 1.5)


def test_default_cache_dir_follows_levers9_home():
    assert cp.default_cache_dir({"LEVERS9_HOME": "/srv/l9"}) == Path("/srv/l9/corpus")
    assert cp.default_cache_dir({}) == Path.home() / ".cache" / "levers9" / "corpus"


# --- unpacking what the default corpus downloads ---------------------------------------------------------

def test_unpacks_the_examples_of_a_deb(tmp_path: Path):
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed here")
    root = tmp_path / "pkg"
    examples = root / cp.SKLEARN_EXAMPLES
    (examples / "cluster").mkdir(parents=True)
    (examples / "cluster" / "plot_a.py").write_text("import sklearn\n")
    (examples / "cluster" / "plot_b.py.gz").write_bytes(gzip.compress(b"import numpy\n"))
    (root / "usr/share/doc/python-sklearn-doc/html").mkdir()
    (root / "usr/share/doc/python-sklearn-doc/html/plot_a.py").write_text("import sklearn\n")
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN" / "control").write_text("Package: python-sklearn-doc\nVersion: 0.0-1\nArchitecture: all\n"
                                             "Maintainer: test <t@example.org>\nDescription: fake\n")
    deb = tmp_path / "python-sklearn-doc_0.0-1_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True,
                   capture_output=True)
    dest = tmp_path / "cache" / "scikit-learn-examples"
    dest.parent.mkdir()
    cp.unpack_deb_examples(deb, dest, cp.SKLEARN_EXAMPLES)
    got = sorted(p.relative_to(dest).as_posix() for p in cp.files([cp.CorpusDir(name="s", path=str(dest))]))
    assert got == ["cluster/plot_a.py", "cluster/plot_b.py"]
    assert (dest / "cluster" / "plot_b.py").read_text() == "import numpy\n"
    assert [p.name for p in dest.parent.iterdir()] == ["scikit-learn-examples"]  # no leftovers


def test_unpacks_only_the_examples_of_an_sdist(tmp_path: Path):
    sdist = tmp_path / "networkx-0.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name, text in [("networkx-0.0/examples/basic/plot_x.py", b"import networkx\n"),
                           ("networkx-0.0/examples/README.txt", b"examples\n"),
                           ("networkx-0.0/networkx/__init__.py", b"")]:
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    dest = tmp_path / "networkx-examples"
    cp.unpack_sdist_examples(sdist, dest)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "README.txt", "basic/plot_x.py"]


def test_fetches_the_default_corpus_or_skips_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Really downloads (about 50 MB from the Debian mirror, one sdist from PyPI) when that works here."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("no apt-get/dpkg-deb here")
    monkeypatch.setattr(cp, "FETCH_TIMEOUT_S", 25.0)
    started = time.monotonic()
    try:
        dirs = cp.fetch_default(tmp_path)
    except cp.CorpusFetchError as exc:
        pytest.skip(f"the default corpus could not be fetched: {exc}")
    assert [d.name for d in dirs] == ["scikit-learn-examples", "networkx-examples"]
    counts = [len(cp.files([d])) for d in dirs]
    assert counts[0] > 100 and counts[1] > 20, counts
    assert cp.fetch_default(tmp_path) == dirs  # the cache is reused
    assert time.monotonic() - started < 60


# --- the pipeline ----------------------------------------------------------------------------------------

class FakePlatform:
    def __init__(self) -> None:
        self.measured: list[list[str]] = []
        self.captured: list[list[list[str]]] = []

    def measure(self, candidates: list[str]) -> list[PackageTiming]:
        self.measured.append(candidates)
        deps = {"scikit-learn": ["numpy", "scipy"], "pandas": ["numpy"], "scipy": ["numpy"]}
        return [PackageTiming(distribution=d, import_seconds=0.5, rss_mib=20, depends_on=deps.get(d, []))
                for d in candidates]

    def capture(self, sets: list[list[str]]) -> list[SharedCheckpoint]:
        self.captured.append(sets)
        return [SharedCheckpoint(checkpoint_id=f"ck{i}", image_id="img-1", packages=[
            PackageTiming(distribution=d) for d in s]) for i, s in enumerate(sets)]


def _config(tmp_path: Path, corpus_dir: Path, **grouping: float) -> pl.PipelineConfig:
    return pl.PipelineConfig(work_dir=str(tmp_path / "work"), default_corpus=False, corpus_dirs=[str(corpus_dir)],
                             holdout=0.2, grouping=pl.gr.GroupingConfig(**grouping))  # type: ignore[arg-type]


def _hooks(fake: FakePlatform) -> pl.Hooks:
    return pl.Hooks(measure=fake.measure, capture=fake.capture, now=lambda: datetime(2025, 1, 2, tzinfo=UTC))


def test_the_pipeline_runs_every_stage_and_writes_each_output(tmp_path: Path, corpus_dir: Path):
    fake = FakePlatform()
    out = io.StringIO()
    results = pl.run(_config(tmp_path, corpus_dir), _hooks(fake), console=Console(file=out, width=120))
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == sorted(f"{s}.json" for s in pl.STAGE_NAMES)
    assert results["corpus"].counts == {"corpus": 7}
    assert fake.measured and set(fake.measured[0]) <= {"numpy", "scikit-learn", "pandas", "matplotlib",
                                                        "networkx", "scipy"}
    groups = results["groups"]
    assert set(groups.scores) == {"greedy", "one_with_everything", "none"}
    assert groups.scores["none"].train_seconds == 0 and groups.scores["greedy"].train_seconds > 0
    assert fake.captured == [groups.sets]
    doc = msgspec.json.decode((tmp_path / "work" / "catalogue.json").read_bytes())
    cat = decode_catalogue(msgspec.json.encode(doc["result"]))
    assert cat.checkpoints[0].image_id == "img-1" and cat.created_at.startswith("2025-01-02")
    assert {p.distribution for p in cat.packages} == set(fake.measured[0])
    assert "analysis" in out.getvalue()


def test_the_pipeline_resumes_and_redoes_only_what_changed(tmp_path: Path, corpus_dir: Path):
    fake = FakePlatform()
    first = pl.run(_config(tmp_path, corpus_dir), _hooks(fake), console=Console(file=io.StringIO()))
    again = pl.run(_config(tmp_path, corpus_dir), _hooks(fake), console=Console(file=io.StringIO()))
    assert len(fake.measured) == 1 and len(fake.captured) == 1
    assert again["catalogue"] == first["catalogue"]
    smaller = pl.run(_config(tmp_path, corpus_dir, memory_budget_mib=100.0), _hooks(fake),
                     console=Console(file=io.StringIO()))
    assert len(fake.measured) == 1  # the measurements did not depend on the grouping's budget
    assert smaller["groups"].config.memory_budget_mib == 100.0
    (corpus_dir / "more.py").write_text("import torch\n")  # a changed corpus redoes the analysis
    redone = pl.run(_config(tmp_path, corpus_dir), _hooks(fake), console=Console(file=io.StringIO()), until="analysis")
    assert redone["analysis"].files == 8


def test_stages_that_need_the_platform_say_so(tmp_path: Path, corpus_dir: Path):
    config = _config(tmp_path, corpus_dir)
    quiet = Console(file=io.StringIO())
    results = pl.run(config, until="analysis", console=quiet)
    assert set(results) == {"corpus", "analysis"}
    with pytest.raises(pl.HookMissing, match="Hooks.measure"):
        pl.run(config, console=quiet)
    fake = FakePlatform()
    with pytest.raises(pl.HookMissing, match="Hooks.capture"):
        pl.run(config, pl.Hooks(measure=fake.measure), console=quiet)
    pl.run(config, pl.Hooks(capture=fake.capture), console=quiet)  # measurements.json is there: no hook needed
    with pytest.raises(pl.PipelineError, match="no stage"):
        pl.run(config, until="publish", console=quiet)


def test_a_damaged_output_is_redone(tmp_path: Path, corpus_dir: Path):
    config = _config(tmp_path, corpus_dir)
    quiet = Console(file=io.StringIO())
    pl.run(config, until="analysis", console=quiet)
    (tmp_path / "work" / "analysis.json").write_text("{not json")
    assert pl.run(config, until="analysis", console=quiet)["analysis"].files == 7
