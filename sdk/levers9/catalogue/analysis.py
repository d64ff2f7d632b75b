"""What the corpus imports: per file its third-party distributions, and how often each is imported.

A file is parsed with `ast` (never run). Every import counts, wherever it is (inside a function, a
try block, an `if TYPE_CHECKING`), by its top-level name: `import a.b` and `from a.b import c` both
give `a`; relative imports are the example's own modules and are skipped; the standard library and
`__future__` are not packages to pre-import. An import name becomes a distribution through the
installed packages' metadata, then a small hand table for common ones that may not be installed
here (sklearn -> scikit-learn); a name that maps to nothing is kept as its own name. Distribution
names are normalised (PEP 503: lower case, runs of -_. become -).

A file that does not parse (syntax errors, an undecodable file) is counted and left out; a file
that parses but imports nothing third-party is still a call (it just saves nothing).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import msgspec

# Import names whose distribution has another name, for when it is not installed where we analyse.
HAND_TABLE: dict[str, str] = {
    "sklearn": "scikit-learn",
    "cv2": "opencv-python",
    "PIL": "pillow",
    "yaml": "pyyaml",
    "skimage": "scikit-image",
    "bs4": "beautifulsoup4",
    "mpl_toolkits": "matplotlib",
    "pylab": "matplotlib",
    "dateutil": "python-dateutil",
    "attr": "attrs",
    "Bio": "biopython",
    "Crypto": "pycryptodome",
    "OpenSSL": "pyopenssl",
    "dotenv": "python-dotenv",
    "jose": "python-jose",
    "jwt": "pyjwt",
    "serial": "pyserial",
    "usb": "pyusb",
    "magic": "python-magic",
    "docx": "python-docx",
    "pptx": "python-pptx",
    "git": "gitpython",
    "gi": "pygobject",
    "osgeo": "gdal",
    "community": "python-louvain",
    "sentence_transformers": "sentence-transformers",
    "tensorflow_hub": "tensorflow-hub",
    "umap": "umap-learn",
    "wx": "wxpython",
    "zmq": "pyzmq",
}

EXCLUDED = frozenset(sys.stdlib_module_names) | {"__future__", "__main__"}
ANALYSIS_VERSION = 1  # bump when the rules above change, so cached analyses are redone


class DistributionFrequency(msgspec.Struct, frozen=True, kw_only=True):
    distribution: str
    files: int  # files importing it
    share: float  # of the files that parsed
    modules: list[str]  # import names that mapped to it, sorted


class Analysis(msgspec.Struct, frozen=True, kw_only=True):
    files: int  # files read
    syntax_errors: int = 0
    decode_errors: int = 0
    paths: list[str] = []  # the files that parsed, in order; per_file[i] is paths[i]'s
    per_file: list[frozenset[str]] = []  # distributions each parsed file imports
    frequency: list[DistributionFrequency] = []  # most imported first

    @property
    def parsed(self) -> int:
        return len(self.paths)


class ParseFailure(ValueError):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind  # "syntax" or "decode"


def normalise(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def imported_modules(source: str | bytes, filename: str = "<corpus>") -> set[str]:
    """Top-level names of every absolute import in the source; ParseFailure when it does not parse."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as exc:
        kind = "decode" if "unicode error" in str(exc) or "decod" in str(exc) else "syntax"
        raise ParseFailure(kind, str(exc)) from None
    except (UnicodeDecodeError, ValueError) as exc:  # bad bytes, a NUL in the source
        raise ParseFailure("decode", str(exc)) from None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def third_party(modules: Iterable[str]) -> set[str]:
    return {m for m in modules if m and m not in EXCLUDED}


def installed_mapping() -> dict[str, str]:
    """Import name -> distribution from the installed packages' metadata, the hand table filling gaps.

    When several installed distributions provide one name, the hand table decides if it knows the
    name, else the first by name (deterministic).
    """
    mapping = {name: normalise(dist) for name, dist in HAND_TABLE.items()}
    for name, dists in importlib.metadata.packages_distributions().items():
        if dists and (len(set(dists)) == 1 or name not in HAND_TABLE):
            mapping[name] = normalise(sorted(dists)[0])
    return mapping


def distribution_of(module: str, mapping: Mapping[str, str]) -> str:
    return normalise(mapping.get(module) or HAND_TABLE.get(module, module))


def analyse_sources(sources: Iterable[tuple[str, bytes]], mapping: Mapping[str, str] | None = None,
                    on_file: Callable[[int], None] | None = None) -> Analysis:
    """The analysis of (path, content) pairs; pure but for `on_file` (called with the count so far)."""
    mapping = HAND_TABLE if mapping is None else mapping
    counts = Counter[str]()
    paths: list[str] = []
    per_file: list[frozenset[str]] = []
    modules_of: dict[str, set[str]] = defaultdict(set)
    seen = syntax = decode = 0
    for path, content in sources:
        seen += 1
        try:
            modules = third_party(imported_modules(content, path))
        except ParseFailure as exc:
            syntax += exc.kind == "syntax"
            decode += exc.kind == "decode"
        else:
            dists = set()
            for module in modules:
                dist = distribution_of(module, mapping)
                modules_of[dist].add(module)
                dists.add(dist)
            counts.update(dists)
            paths.append(path)
            per_file.append(frozenset(dists))
        if on_file is not None:
            on_file(seen)
    return Analysis(files=seen, syntax_errors=syntax, decode_errors=decode, paths=paths, per_file=per_file,
                    frequency=frequency_table(counts, modules_of, len(paths)))


def frequency_table(counts: Mapping[str, int], modules_of: Mapping[str, set[str]],
                    parsed: int) -> list[DistributionFrequency]:
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [DistributionFrequency(distribution=dist, files=n, share=n / parsed if parsed else 0.0,
                                  modules=sorted(modules_of.get(dist, ()))) for dist, n in ranked]


def analyse(paths: Sequence[Path], mapping: Mapping[str, str] | None = None,
            on_file: Callable[[int], None] | None = None) -> Analysis:
    """Read and analyse the files; the mapping defaults to the installed metadata plus the hand table."""
    mapping = installed_mapping() if mapping is None else mapping
    return analyse_sources(((str(p), p.read_bytes()) for p in paths), mapping, on_file)


def top_distributions(calls: Iterable[frozenset[str]], n: int) -> list[str]:
    """The n distributions most calls import (ties by name): the candidates to measure.

    Whether each can be installed in the flavor's image is the measurement hook's concern.
    """
    counts = Counter[str]()
    for call in calls:
        counts.update(call)
    return [d for d, _n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def calls_of(analysis: Analysis, paths: Iterable[str]) -> list[frozenset[str]]:
    """The distribution sets of the given parsed files (the calls a grouping is chosen or judged on)."""
    index = {p: i for i, p in enumerate(analysis.paths)}
    return [analysis.per_file[index[p]] for p in paths if p in index]
