"""Which package sets to capture as shared pre-import checkpoints: pure, no I/O.

The model. A call is the set of distributions one corpus file imports. A checkpoint is a set S of
distributions held imported. Importing a package imports its dependencies (sklearn -> numpy, scipy),
so both are taken through their dependency closure, restricted to the measured packages. A measured
`import_seconds` (and `rss_mib`) includes the package's dependencies, so each package gets an *own*
cost: its measured cost minus the own costs of everything in its strict dependency closure, floored
at 0; the cost of a closed set is the sum of its members' own costs, each counted once however many
packages share it. A call c served by checkpoint S saves seconds(closure(c) & closure(S)): a
checkpoint holding packages the call does not import still saves those it does import, and what it
lacks is imported on top. A call is served by the one checkpoint that saves it most, so the value of
a choice of sets is the mean, over the corpus's calls, of the best saving among them (0 when none).
Memory: each set costs a per-checkpoint base plus the own RSS of its closure; the sum over the sets
must fit the budget.

The algorithm, greedy like OpenLambda's Forklift:
1. Candidates: the most frequent distinct call-sets, pairwise unions of the most frequent of those,
   each frequent package alone, and every prefix of the packages ranked by frequency ("the top i");
   each closed under dependencies, deduplicated, those that cannot fit the budget alone dropped. None
   depends on the budget but for that last filter, which step 3 needs.
2. Repeatedly add the candidate with the best marginal gain (the increase of the mean saving per
   call) among those fitting the memory left, ties to the smaller then the alphabetically first set,
   until K sets or no candidate gains anything.
3. Greedy is not monotone in the budget: a big set that only fits a larger budget can crowd out two
   smaller ones that save more together. So it is run on every budget at or below the given one where
   its decisions change (a budget just below the largest memory sum it found fitting), and the best
   result wins: the answer is that of the best budget <= B, so more budget never saves less.

Baselines for the benchmark: `one_with_everything` (one set: every measured package, most frequent
first, that still fits) and `none` (no shared checkpoint). `expected_saving` scores any of them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from levers9.contracts.catalogue import PackageTiming

NO_GAIN = 1e-12
MAX_RUNS = 5000  # budgets tried in step 3; far above what K <= 10 and ~100 candidates need


class GroupingConfig(msgspec.Struct, frozen=True, kw_only=True):
    max_sets: int = 4  # K
    memory_budget_mib: float = 4096.0  # for all the sets together
    base_mib: float = 40.0  # per checkpoint: the interpreter and the executor
    max_call_sets: int = 48  # most frequent distinct call-sets taken as candidates
    max_unions: int = 8  # pairwise unions among that many most frequent call-sets


@dataclass
class Model:
    """The measured packages as bit positions, with own costs and dependency closures."""
    names: list[str]
    own_seconds: list[float]
    own_rss: list[float]
    closures: list[int]  # per bit: the mask of the package and everything it imports
    _seconds: dict[int, float] = field(default_factory=dict)
    _rss: dict[int, float] = field(default_factory=dict)

    @classmethod
    def of(cls, packages: Iterable[PackageTiming]) -> Model:
        by_name = {p.distribution: p for p in packages}
        names = sorted(by_name)
        index = {n: i for i, n in enumerate(names)}
        closures = [_closure_mask(i, names, by_name, index) for i in range(len(names))]
        strict = [c & ~(1 << i) for i, c in enumerate(closures)]
        secs = _own([by_name[n].import_seconds for n in names], strict)
        rss = _own([by_name[n].rss_mib for n in names], strict)
        return cls(names=names, own_seconds=secs, own_rss=rss, closures=closures)

    def mask(self, distributions: Iterable[str]) -> int:
        """The closure of the measured ones among `distributions` (others cannot be checkpointed)."""
        out = 0
        for i, name in enumerate(self.names):
            if name in distributions:
                out |= self.closures[i]
        return out

    def set_of(self, mask: int) -> frozenset[str]:
        return frozenset(n for i, n in enumerate(self.names) if mask >> i & 1)

    def seconds(self, mask: int) -> float:
        if mask not in self._seconds:
            self._seconds[mask] = sum(s for i, s in enumerate(self.own_seconds) if mask >> i & 1)
        return self._seconds[mask]

    def rss(self, mask: int) -> float:
        if mask not in self._rss:
            self._rss[mask] = sum(r for i, r in enumerate(self.own_rss) if mask >> i & 1)
        return self._rss[mask]


def _closure_mask(i: int, names: list[str], by_name: Mapping[str, PackageTiming], index: Mapping[str, int]) -> int:
    mask, todo = 0, [i]
    while todo:
        j = todo.pop()
        if mask >> j & 1:
            continue
        mask |= 1 << j
        todo.extend(index[d] for d in by_name[names[j]].depends_on if d in index)
    return mask


def _own(measured: list[float], strict: list[int]) -> list[float]:
    """Own cost = measured minus the own costs of the strict closure, computed fewest deps first.

    A dependency cycle (which should not happen) counts the members of the cycle not yet computed as 0.
    """
    own: list[float | None] = [None] * len(measured)
    for i in sorted(range(len(measured)), key=lambda k: (strict[k].bit_count(), k)):
        deps = sum(own[j] or 0.0 for j in range(len(measured)) if strict[i] >> j & 1)
        own[i] = max(0.0, measured[i] - deps)
    return [o or 0.0 for o in own]


def _weighted_calls(calls: Sequence[Iterable[str]], model: Model) -> list[tuple[int, int]]:
    counts = Counter(model.mask(set(c)) for c in calls)
    return sorted((m, w) for m, w in counts.items() if m)


def expected_saving(sets: Sequence[Iterable[str]], calls: Sequence[Iterable[str]],
                    packages: Iterable[PackageTiming]) -> float:
    """Mean import seconds saved per call when each call is served by its best set (0 for no calls)."""
    if not calls:
        return 0.0
    model = Model.of(packages)
    masks = [model.mask(set(s)) for s in sets]
    total = sum(w * max((model.seconds(c & m) for m in masks), default=0.0)
                for c, w in _weighted_calls(calls, model))
    return total / len(calls)


def memory_mib(sets: Sequence[Iterable[str]], packages: Iterable[PackageTiming], base_mib: float) -> float:
    model = Model.of(packages)
    return sum(base_mib + model.rss(model.mask(set(s))) for s in sets)


def set_seconds(distributions: Iterable[str], packages: Iterable[PackageTiming]) -> float:
    """What a set saves a call importing all of it: the own seconds of its closure."""
    model = Model.of(packages)
    return model.seconds(model.mask(set(distributions)))


def none() -> list[frozenset[str]]:
    """The baseline without shared checkpoints."""
    return []


def one_with_everything(calls: Sequence[Iterable[str]], packages: Iterable[PackageTiming],
                        config: GroupingConfig) -> list[frozenset[str]]:
    """The baseline of one set: every measured package, most frequent first, while it still fits."""
    model = Model.of(packages)
    mask = _everything_mask(model, _weighted_calls(calls, model), config)
    return [model.set_of(mask)] if mask else []


def _everything_mask(model: Model, weighted: list[tuple[int, int]], config: GroupingConfig) -> int:
    mask = 0
    for i in _ranked_bits(model, weighted, keep_unused=True):
        grown = mask | model.closures[i]
        if config.base_mib + model.rss(grown) <= config.memory_budget_mib:
            mask = grown
    return mask


def _ranked_bits(model: Model, weighted: list[tuple[int, int]], keep_unused: bool) -> list[int]:
    """Packages by the number of calls importing them (with deps), then seconds, then name."""
    freq = [sum(w for c, w in weighted if c >> i & 1) for i in range(len(model.names))]
    bits = [i for i in range(len(model.names)) if keep_unused or freq[i]]
    return sorted(bits, key=lambda i: (-freq[i], -model.own_seconds[i], model.names[i]))


def candidate_sets(calls: Sequence[Iterable[str]], packages: Iterable[PackageTiming],
                   config: GroupingConfig) -> list[frozenset[str]]:
    """Step 1's candidates (closed under dependencies, each fitting the budget alone)."""
    model = Model.of(packages)
    return [model.set_of(m) for m in _candidates(model, _weighted_calls(calls, model), config)]


def _candidates(model: Model, weighted: list[tuple[int, int]], config: GroupingConfig) -> list[int]:
    frequent = [c for c, _w in sorted(weighted, key=lambda cw: (-cw[1], -model.seconds(cw[0]), cw[0]))]
    found: dict[int, None] = dict.fromkeys(frequent[:config.max_call_sets])
    top = frequent[:config.max_unions]
    for a in range(len(top)):
        for b in range(a + 1, len(top)):
            found.setdefault(top[a] | top[b])
    prefix = 0
    for i in _ranked_bits(model, weighted, keep_unused=False):
        found.setdefault(model.closures[i])
        prefix |= model.closures[i]
        found.setdefault(prefix)
    fits = [m for m in found if m and config.base_mib + model.rss(m) <= config.memory_budget_mib]
    # The order breaks ties in step 2: the smaller set first, then by name.
    return sorted(fits, key=lambda m: (config.base_mib + model.rss(m), sorted(model.set_of(m))))


@dataclass
class _Run:
    chosen: list[int]
    value: float  # mean seconds saved per call
    lowest_fit: float  # the largest memory sum that had to fit; the same choice holds down to it


def _greedy(model: Model, weighted: list[tuple[int, int]], total: int, cands: list[int],
            config: GroupingConfig, budget: float) -> _Run:
    """Step 2 at one budget, noting the budgets at which its decisions would change."""
    chosen: list[int] = []
    best = dict.fromkeys((c for c, _w in weighted), 0.0)
    used, value, lowest_fit = 0.0, 0.0, -math.inf
    for _ in range(config.max_sets):
        pick, pick_gain = 0, NO_GAIN
        for cand in cands:
            need = used + config.base_mib + model.rss(cand)
            if cand in chosen or need > budget:
                continue
            lowest_fit = max(lowest_fit, need)
            gain = sum(w * max(0.0, model.seconds(c & cand) - best[c]) for c, w in weighted) / total
            if gain > pick_gain:
                pick, pick_gain = cand, gain
        if not pick:
            break  # no candidate fits or gains: more sets would only cost memory
        chosen.append(pick)
        used += config.base_mib + model.rss(pick)
        value += pick_gain
        for c in best:
            best[c] = max(best[c], model.seconds(c & pick))
    return _Run(chosen=chosen, value=value, lowest_fit=lowest_fit)


def group(calls: Sequence[Iterable[str]], packages: Iterable[PackageTiming],
          config: GroupingConfig) -> list[frozenset[str]]:
    """At most K dependency-closed sets, most valuable first (step 3 over step 2 over step 1)."""
    model = Model.of(packages)
    weighted = _weighted_calls(calls, model)
    if not weighted or config.max_sets <= 0:
        return []
    cands = _candidates(model, weighted, config)
    budget, best = config.memory_budget_mib, _Run(chosen=[], value=0.0, lowest_fit=-math.inf)
    for _ in range(MAX_RUNS):
        run = _greedy(model, weighted, len(calls), cands, config, budget)
        if run.value > best.value + NO_GAIN:
            best = run
        if run.lowest_fit == -math.inf:
            break  # nothing fits any lower budget either
        budget = math.nextafter(run.lowest_fit, -math.inf)
    return [model.set_of(m) for m in best.chosen]
