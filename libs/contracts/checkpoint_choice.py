"""The online cost model: which checkpoint (or none) a Python function call starts from, on which worker.

Pure, no I/O (DESIGN.md, "The second path", step 3). The scheduler builds the inputs from what it
already holds and calls `choose_checkpoint(call, candidates, workers)`:

- `CallNeeds` — the call: the distributions it imports (mapped from the client's `ast` import names
  by `distributions_for_imports` with `module_table(catalogue.packages)`; the mapping happens before,
  so the cost model sees distribution names only), its `packages=`, the distributions its own image
  has, its flavor, and the per-distribution measurements (`import_table(catalogue.packages)`).
- `Candidate` — cold (`cold_candidate`, also added by `choose_checkpoint` when the list has none),
  each shared pre-import checkpoint of the flavor (`shared_candidates`), the deployment's own
  checkpoint (`own_candidate`). A function with `shared_checkpoints=False` is the caller's concern:
  it passes no shared candidates.
- `WorkerView` — one worker the scheduler's placement already accepted (capacity, pool, features):
  the checkpoint ids it can restore (what it announced in WorkerCatalogueChecked, where it compared
  the capture settings with `settings_mismatch`, plus the own checkpoint when it has CRIU and the
  accelerator) and the checkpoint blobs its node cache holds.

The cost of a (candidate, worker) pair, in seconds, never below 0:

    restore_seconds                       measured (cold: the cold start)
  + size_bytes / FETCH_BYTES_PER_SECOND   when the worker's node cache lacks the blob
  + import seconds                        of the call's distributions the candidate has not imported
  + install seconds                       of what the call needs that the candidate's image lacks
  - LOCALITY_BONUS_SECONDS                when the worker's node cache holds the blob

Import seconds count each distribution once: the call's distributions and the candidate's are both
closed over `depends_on`, and each missing distribution costs its own import time without its
dependencies (`import_table` derives that from the catalogue's with-dependencies medians). What
must be installed: the call's `packages=` plus the distributions it imports that its own image has
(a shared checkpoint runs on the catalogue's image, which may lack them); versions are not compared.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Annotated, Collection, Iterable, Literal, Mapping

import msgspec
from msgspec import Meta

from .catalogue import Catalogue, Flavor, PackageTiming, SandboxSettings
from .spec import CheckpointRef

# An import the catalogue never measured: a small pure-Python package, its dependencies aside.
DEFAULT_IMPORT_SECONDS = 0.2
# One `pip install` of a package the image lacks: resolve, download and unpack a wheel from a near index.
DEFAULT_INSTALL_SECONDS = 5.0
# A cold function sandbox until one is measured: container start, interpreter, executor ready.
DEFAULT_COLD_START_SECONDS = 1.5
# A checkpoint whose restore was never measured (node cache warm).
DEFAULT_RESTORE_SECONDS = 0.5
# Object store to node cache: a checkpoint blob the worker lacks is fetched whole before the restore.
FETCH_BYTES_PER_SECOND = 200e6
# A worker whose node cache holds the blob likely has it in its page cache too, and choosing it
# leaves the other nodes' caches to other checkpoints. Below the noise of a restore measurement, so
# it only decides near ties (and ties where the size is unknown, so there is no fetch penalty).
LOCALITY_BONUS_SECONDS = 0.05
# How many candidates a Choice keeps in `considered` (ContainerScheduled carries it).
CONSIDERED_KEPT = 5

Kind = Literal["own", "shared", "cold"]
KIND_ORDER: dict[str, int] = {"own": 0, "shared": 1, "cold": 2}  # ties go to the first
Seconds = Annotated[float, Meta(ge=0)]


class CallNeeds(msgspec.Struct, frozen=True, kw_only=True):
    """One call, as the cost model sees it. Distribution names are normalized (`normalize`)."""
    distributions: frozenset[str] = frozenset()  # it imports (mapped from import names; deps optional)
    packages: list[str] = []  # its `packages=` requirements, as written (`name==1.2`, `name[extra]`, a URL)
    image_distributions: frozenset[str] = frozenset()  # installed in the function's own image
    flavor: Flavor = "cpu"
    import_seconds: dict[str, Seconds] = {}  # distribution -> its own import seconds, dependencies aside
    depends_on: dict[str, frozenset[str]] = {}  # distribution -> distributions importing it imports
    default_import_seconds: Seconds = DEFAULT_IMPORT_SECONDS
    install_seconds: dict[str, Seconds] = {}  # distribution -> install estimate, when known
    default_install_seconds: Seconds = DEFAULT_INSTALL_SECONDS
    cold_start_seconds: Seconds = DEFAULT_COLD_START_SECONDS  # the cold candidate added when none is given
    executor_generation: int = 0  # the wire generation the function speaks; 0: any


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """One way to start the sandbox: cold, a shared pre-import checkpoint, or the deployment's own."""
    kind: Kind
    checkpoint_id: str = ""  # "" for cold
    distributions: frozenset[str] = frozenset()  # held imported (closed over depends_on when costed)
    restore_seconds: Seconds = 0.0  # measured, node cache warm; cold: the cold start
    size_bytes: Annotated[int, Meta(ge=0)] = 0
    image_distributions: frozenset[str] = frozenset()  # shared: the catalogue's image; own, cold: the function's
    settings: SandboxSettings | None = None  # captured with (shared); workers compare them before announcing
    accelerator: str = ""  # the GPU type a restore needs ("" none)
    flavor: Flavor = "cpu"
    executor_generation: int = 0  # 0: any

    @property
    def key(self) -> str:
        """"cold", "shared:<id>" or "own:<id>": how `regret` and the benchmark name a candidate."""
        return "cold" if self.kind == "cold" else f"{self.kind}:{self.checkpoint_id}"


class WorkerView(msgspec.Struct, frozen=True, kw_only=True):
    """A worker placement accepted for this call. Any worker can start cold."""
    worker_id: str
    restorable: frozenset[str] = frozenset()  # checkpoint ids it can restore (announced, settings match)
    cached: frozenset[str] = frozenset()  # checkpoint ids whose blob its node cache holds


class Estimate(msgspec.Struct, frozen=True, kw_only=True):
    """One (candidate, worker) pair's cost, by part; `seconds` is their sum, never below 0."""
    candidate: str  # Candidate.key
    kind: Kind
    checkpoint_id: str
    worker_id: str
    seconds: float
    restore: float = 0.0
    fetch: float = 0.0
    imports: float = 0.0
    installs: float = 0.0
    locality: float = 0.0  # subtracted
    missing_imports: list[str] = []
    missing_installs: list[str] = []


class Choice(msgspec.Struct, frozen=True, kw_only=True):
    candidate: Candidate
    worker_id: str
    estimate: Estimate  # of the chosen pair; estimate.seconds is the estimate
    runner_up: Estimate | None = None  # the best pair of another candidate
    considered: list[Estimate] = []  # each candidate's best pair, best first, at most CONSIDERED_KEPT

    @property
    def estimate_seconds(self) -> float:
        return self.estimate.seconds

    @property
    def checkpoint(self) -> str:
        return self.candidate.checkpoint_id


# ---- names -----------------------------------------------------------------------------------------

_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?=$|[\[(<>=!~;@\s,])")


def normalize(name: str) -> str:
    """PEP 503: `Scikit_Learn` and `scikit.learn` are `scikit-learn`."""
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def requirement_name(requirement: str) -> str:
    """The distribution a `packages=` entry installs, normalized; "" for a bare URL or path (unknown)."""
    if "://" in requirement.split("@", 1)[0] or requirement.startswith((".", "/")):
        return ""
    m = _REQUIREMENT_NAME.match(requirement)
    return normalize(m.group(1)) if m else ""


def module_table(packages: Iterable[PackageTiming]) -> dict[str, str]:
    """Top-level import name -> distribution, from the catalogue's measurements (sklearn -> scikit-learn)."""
    table: dict[str, str] = {}
    for p in sorted(packages, key=lambda p: p.distribution):
        for module in p.modules:
            table.setdefault(module, normalize(p.distribution))
    return table


def distributions_for_imports(imports: Iterable[str], modules: Mapping[str, str]) -> frozenset[str]:
    """The distributions a call's import names (the client's `ast`, maybe dotted) stand for. The
    standard library is dropped; a name the table lacks is taken as its own distribution (most are),
    and costs DEFAULT_IMPORT_SECONDS on every candidate that has not imported it."""
    found = set()
    for name in imports:
        top = name.strip().split(".", 1)[0]
        if not top or top in sys.stdlib_module_names or top == "__future__":
            continue
        found.add(modules.get(top) or normalize(top))
    return frozenset(found)


def import_table(packages: Iterable[PackageTiming]) -> tuple[dict[str, float], dict[str, frozenset[str]]]:
    """(own import seconds, depends_on) per distribution. The catalogue measures each import with its
    dependencies; a distribution's own time is that minus its dependency closure's own times (>= 0)."""
    timings = {normalize(p.distribution): p for p in packages}
    deps = {d: frozenset(normalize(x) for x in p.depends_on) - {d} for d, p in timings.items()}
    own: dict[str, float] = {}

    def own_seconds(d: str, visiting: frozenset[str]) -> float:
        if d not in own:
            below = closure(deps.get(d, frozenset()), deps) - {d} - visiting
            beneath = math.fsum(own_seconds(x, visiting | {d}) for x in sorted(below) if x in timings)
            own[d] = max(0.0, timings[d].import_seconds - beneath)
        return own[d]

    for d in sorted(timings):
        own_seconds(d, frozenset())
    return own, deps


def closure(distributions: Iterable[str], depends_on: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """The distributions and everything they import, transitively (cycles are fine)."""
    seen: set[str] = set()
    todo = list(distributions)
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(depends_on.get(d, ()))
    return frozenset(seen)


# ---- candidates ------------------------------------------------------------------------------------

def catalogue_image_distributions(catalogue: Catalogue) -> frozenset[str]:
    """The flavor's image has every catalogued package installed, with what they depend on."""
    _, deps = import_table(catalogue.packages)
    return closure((normalize(p.distribution) for p in catalogue.packages), deps)


def shared_candidates(catalogue: Catalogue, flavor: Flavor, worker_restorable_ids: Collection[str]) -> list[Candidate]:
    """The catalogue's checkpoints of `flavor` that at least one worker announced it can restore."""
    if catalogue.flavor != flavor:
        return []
    image = catalogue_image_distributions(catalogue)
    out = []
    for cp in catalogue.checkpoints:
        if cp.flavor != flavor or cp.checkpoint_id not in worker_restorable_ids:
            continue
        out.append(Candidate(
            kind="shared", checkpoint_id=cp.checkpoint_id,
            distributions=frozenset(normalize(d) for d in cp.distributions),
            restore_seconds=cp.restore_seconds or DEFAULT_RESTORE_SECONDS, size_bytes=max(0, cp.size_bytes),
            image_distributions=image, settings=cp.settings, accelerator=cp.settings.gpu, flavor=flavor,
            executor_generation=cp.executor_generation))
    return out


def cold_candidate(call: CallNeeds) -> Candidate:
    return Candidate(kind="cold", restore_seconds=call.cold_start_seconds,
                     image_distributions=call.image_distributions, flavor=call.flavor)


def own_candidate(call: CallNeeds, ref: CheckpointRef, *, restore_seconds: float = 0.0,
                  distributions: Iterable[str] = ()) -> Candidate:
    """The deployment's own checkpoint: on the function's image; `distributions`, what it holds
    imported when known (its module's imports), else nothing is assumed."""
    return Candidate(kind="own", checkpoint_id=ref.checkpoint_id,
                     distributions=frozenset(normalize(d) for d in distributions),
                     restore_seconds=restore_seconds or DEFAULT_RESTORE_SECONDS, size_bytes=max(0, ref.size_bytes),
                     image_distributions=call.image_distributions, accelerator=ref.accelerator, flavor=call.flavor)


def settings_mismatch(captured: SandboxSettings, mine: SandboxSettings) -> str:
    """Why a worker with sandbox settings `mine` cannot restore a checkpoint captured with `captured`,
    naming each difference; "" when it can. CPU features the worker has beyond the capture's are fine."""
    why = []
    if captured.network_mode != mine.network_mode:
        why.append(f"network mode {mine.network_mode!r} here, {captured.network_mode!r} at capture")
    if captured.overlay != mine.overlay:
        why.append(f"overlay {_on(mine.overlay)} here, {_on(captured.overlay)} at capture")
    if captured.lazy_image != mine.lazy_image:
        why.append(f"lazy image {_on(mine.lazy_image)} here, {_on(captured.lazy_image)} at capture")
    if captured.gpu != mine.gpu:
        why.append(f"GPU {mine.gpu or 'none'!r} here, {captured.gpu or 'none'!r} at capture")
    missing = sorted(set(captured.cpu_features) - set(mine.cpu_features))
    if missing:
        why.append(f"CPU features missing here: {', '.join(missing)}")
    if captured.python != mine.python:
        why.append(f"Python {mine.python or 'unknown'} here, {captured.python or 'unknown'} at capture")
    return "; ".join(why)


def _on(flag: bool) -> str:
    return "on" if flag else "off"


# ---- the choice ------------------------------------------------------------------------------------

class _Prepared(msgspec.Struct, frozen=True):
    """A candidate's worker-independent cost."""
    candidate: Candidate
    imports: float
    installs: float
    missing_imports: list[str]
    missing_installs: list[str]


def _prepare(call: CallNeeds, candidate: Candidate, needed: frozenset[str], required: frozenset[str],
             unnamed: int) -> _Prepared:
    held = closure(candidate.distributions, call.depends_on)
    missing = sorted(needed - held)
    imports = math.fsum(call.import_seconds.get(d, call.default_import_seconds) for d in missing)
    lacking = sorted(required - candidate.image_distributions - held)
    installs = math.fsum(call.install_seconds.get(d, call.default_install_seconds) for d in lacking)
    installs += unnamed * call.default_install_seconds  # URLs and paths: pip installs them every time
    return _Prepared(candidate, imports, installs, missing, lacking + ["<url>"] * unnamed)


def _usable(call: CallNeeds, candidate: Candidate) -> bool:
    if candidate.kind != "cold" and not candidate.checkpoint_id:
        return False
    if candidate.flavor != call.flavor:
        return False
    gens = (call.executor_generation, candidate.executor_generation)
    return not (all(gens) and gens[0] != gens[1])


def _estimate(p: _Prepared, worker: WorkerView) -> Estimate | None:
    c = p.candidate
    fetch = locality = 0.0
    if c.kind != "cold":
        if c.checkpoint_id not in worker.restorable:
            return None
        if c.checkpoint_id in worker.cached:
            locality = LOCALITY_BONUS_SECONDS
        else:
            fetch = c.size_bytes / FETCH_BYTES_PER_SECOND
    seconds = max(0.0, math.fsum((c.restore_seconds, fetch, p.imports, p.installs, -locality)))
    return Estimate(candidate=c.key, kind=c.kind, checkpoint_id=c.checkpoint_id, worker_id=worker.worker_id,
                    seconds=seconds, restore=c.restore_seconds, fetch=fetch, imports=p.imports,
                    installs=p.installs, locality=locality, missing_imports=p.missing_imports,
                    missing_installs=p.missing_installs)


def _rank(e: Estimate) -> tuple[float, int, str, str]:
    return (e.seconds, KIND_ORDER[e.kind], e.checkpoint_id, e.worker_id)


def choose_checkpoint(call: CallNeeds, candidates: list[Candidate], workers: list[WorkerView]) -> Choice | None:
    """The cheapest (candidate, worker) pair; ties go to own, then shared, then cold, then the
    smaller checkpoint id, then the smaller worker id. A cold candidate is added when `candidates`
    has none, so the answer is None only when there is no worker. Candidates of another flavor or
    executor generation are skipped; checkpoint ids are taken as unique."""
    if not workers:
        return None
    pool = [c for c in candidates if _usable(call, c)]
    if not any(c.kind == "cold" for c in pool):
        pool.append(cold_candidate(call))
    needed = closure(call.distributions, call.depends_on)
    names = [requirement_name(r) for r in call.packages]
    required = frozenset(n for n in names if n) | (needed & call.image_distributions)
    unnamed = sum(1 for n in names if not n)
    best_of: dict[str, tuple[Candidate, Estimate]] = {}
    for c in pool:
        p = _prepare(call, c, needed, required, unnamed)
        for w in workers:
            e = _estimate(p, w)
            if e is None:
                continue
            held = best_of.get(c.key)
            if held is None or _rank(e) < _rank(held[1]):
                best_of[c.key] = (c, e)
    if not best_of:
        return None
    ranked = sorted(best_of.values(), key=lambda ce: _rank(ce[1]))
    chosen, estimate = ranked[0]
    return Choice(candidate=chosen, worker_id=estimate.worker_id, estimate=estimate,
                  runner_up=ranked[1][1] if len(ranked) > 1 else None,
                  considered=[e for _, e in ranked[:CONSIDERED_KEPT]])


def regret(chosen: Choice | str, measured_by_candidate: Mapping[str, float]) -> float:
    """(measured seconds of the chosen candidate - the best measured) / the best measured, for the
    benchmark: 0 when the model chose the fastest. Keys are `Candidate.key`; the chosen one must be measured."""
    key = chosen.candidate.key if isinstance(chosen, Choice) else chosen
    if key not in measured_by_candidate:
        raise KeyError(f"the chosen candidate {key!r} was not measured")
    best = min(measured_by_candidate.values())
    mine = measured_by_candidate[key]
    if best <= 0:
        return 0.0 if mine <= best else math.inf
    return (mine - best) / best
