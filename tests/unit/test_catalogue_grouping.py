"""The grouping of packages into at most K shared pre-import checkpoints (pure; hypothesis properties)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.catalogue import grouping as gr
from levers9.contracts.catalogue import PackageTiming

EPS = 1e-9


def pt(name: str, seconds: float, rss: float = 10.0, deps: tuple[str, ...] = ()) -> PackageTiming:
    return PackageTiming(distribution=name, import_seconds=seconds, rss_mib=rss, depends_on=list(deps))


SCIENCE = [pt("numpy", 0.3, 20), pt("scipy", 0.5, 30, ("numpy",)), pt("scikit-learn", 1.0, 60, ("numpy", "scipy")),
           pt("pandas", 0.8, 50, ("numpy",)), pt("matplotlib", 0.6, 40, ("numpy",))]


# --- the model -------------------------------------------------------------------------------------------

def test_own_costs_subtract_the_dependencies_once():
    model = gr.Model.of(SCIENCE)
    own = dict(zip(model.names, model.own_seconds, strict=True))
    assert own == pytest.approx({"numpy": 0.3, "scipy": 0.2, "scikit-learn": 0.5, "pandas": 0.5, "matplotlib": 0.3})
    assert gr.set_seconds(["scikit-learn"], SCIENCE) == pytest.approx(1.0)  # its measured seconds, deps included
    assert gr.set_seconds(["scikit-learn", "pandas"], SCIENCE) == pytest.approx(1.5)  # numpy counted once
    assert model.set_of(model.mask({"scikit-learn"})) == {"scikit-learn", "scipy", "numpy"}


def test_a_call_is_saved_what_it_shares_with_the_checkpoint():
    # pandas is not in the checkpoint, but numpy (which pandas imports) is.
    assert gr.expected_saving([{"scikit-learn"}], [{"pandas"}], SCIENCE) == pytest.approx(0.3)
    # the call is served by its best checkpoint, not by the sum of them
    assert gr.expected_saving([{"pandas"}, {"matplotlib"}], [{"pandas", "matplotlib"}], SCIENCE) == pytest.approx(0.8)
    # a call importing nothing measured saves nothing but counts in the mean
    assert gr.expected_saving([{"pandas"}], [{"pandas"}, {"torch"}, set()], SCIENCE) == pytest.approx(0.8 / 3)
    assert gr.expected_saving(gr.none(), [{"pandas"}], SCIENCE) == 0.0
    assert gr.expected_saving([{"pandas"}], [], SCIENCE) == 0.0


def test_own_costs_are_floored_and_a_cycle_does_not_hang():
    odd = [pt("a", 0.1, 5, ("b",)), pt("b", 0.5, 5), pt("c", 1.0, 5, ("d",)), pt("d", 1.0, 5, ("c",))]
    model = gr.Model.of(odd)
    assert min(model.own_seconds) >= 0 and dict(zip(model.names, model.own_seconds, strict=True))["a"] == 0.0
    assert gr.group([{"c"}, {"a"}], odd, gr.GroupingConfig(max_sets=2))


def test_memory_is_a_base_per_set_plus_the_closures_rss():
    assert gr.memory_mib([{"scikit-learn"}, {"pandas"}], SCIENCE, base_mib=40) == pytest.approx(40 + 60 + 40 + 50)


# --- the choice ------------------------------------------------------------------------------------------

def test_with_room_for_everything_one_set_holds_every_frequent_package():
    calls = [{"scikit-learn", "matplotlib"}] * 5 + [{"pandas"}] * 3 + [set()] * 2
    sets = gr.group(calls, SCIENCE, gr.GroupingConfig(max_sets=3, memory_budget_mib=10_000))
    best = gr.expected_saving(sets, calls, SCIENCE)
    assert best == pytest.approx((5 * 1.3 + 3 * 0.8) / 10)
    assert gr.one_with_everything(calls, SCIENCE, gr.GroupingConfig(memory_budget_mib=10_000)) == [
        frozenset({"numpy", "scipy", "scikit-learn", "pandas", "matplotlib"})]


def test_a_tight_budget_splits_the_packages_into_sets_that_serve_different_calls():
    calls = [{"scikit-learn"}] * 5 + [{"pandas"}] * 5
    config = gr.GroupingConfig(max_sets=2, memory_budget_mib=180, base_mib=10)
    # sklearn alone needs 10 + 60 (closure rss 20+10+30), pandas alone 10 + 50; together 10 + 90
    sets = gr.group(calls, SCIENCE, config)
    assert gr.expected_saving(sets, calls, SCIENCE) == pytest.approx((5 * 1.0 + 5 * 0.8) / 10)
    assert gr.memory_mib(sets, SCIENCE, 10) <= 180


def test_more_budget_does_not_let_a_big_set_crowd_out_two_better_ones():
    # Greedy alone at 230 MiB takes "big" (the best single set) and then has no room; at 200 MiB it takes
    # a and b, worth more together. The answer at 230 must be at least that at 200.
    packages = [pt("a", 1.0, 100), pt("b", 1.0, 100), pt("big", 1.0, 201)]
    calls = [{"a"}] * 3 + [{"b"}] * 3 + [{"big"}] * 5

    def config(budget: float) -> gr.GroupingConfig:
        return gr.GroupingConfig(max_sets=2, memory_budget_mib=budget, base_mib=0, max_unions=0)
    at_200 = gr.group(calls, packages, config(200))
    at_230 = gr.group(calls, packages, config(230))
    assert sorted(map(sorted, at_200)) == [["a"], ["b"]]
    assert sorted(map(sorted, at_230)) == [["a"], ["b"]]
    assert gr.expected_saving(at_230, calls, packages) == pytest.approx(6 / 11)


def test_nothing_fits_or_nothing_to_save():
    calls = [{"pandas"}]
    assert gr.group(calls, SCIENCE, gr.GroupingConfig(memory_budget_mib=10)) == []
    assert gr.one_with_everything(calls, SCIENCE, gr.GroupingConfig(memory_budget_mib=10)) == []
    assert gr.group(calls, SCIENCE, gr.GroupingConfig(max_sets=0)) == []
    assert gr.group([{"torch"}, set()], SCIENCE, gr.GroupingConfig()) == []


# --- properties ------------------------------------------------------------------------------------------

NAMES = [f"p{i}" for i in range(7)]


@st.composite
def packages_st(draw: st.DrawFn) -> list[PackageTiming]:
    chosen = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=len(NAMES), unique=True))
    out = []
    for i, name in enumerate(chosen):
        deps = draw(st.lists(st.sampled_from(chosen[:i]), unique=True, max_size=2)) if i else []
        out.append(pt(name, draw(st.floats(0, 3)), draw(st.floats(0, 200)), tuple(deps)))
    return out


calls_st = st.lists(st.frozensets(st.sampled_from([*NAMES, "unmeasured"]), max_size=4), max_size=30)
config_st = st.builds(gr.GroupingConfig, max_sets=st.integers(0, 4), memory_budget_mib=st.floats(0, 800),
                      base_mib=st.floats(0, 50), max_call_sets=st.integers(1, 20), max_unions=st.integers(0, 5))
PROPS = settings(max_examples=150, deadline=None)


@PROPS
@given(packages_st(), calls_st, config_st)
def test_never_more_than_k_sets_nor_over_the_budget(packages, calls, config):
    sets = gr.group(calls, packages, config)
    assert len(sets) <= config.max_sets
    assert gr.memory_mib(sets, packages, config.base_mib) <= config.memory_budget_mib + EPS
    everything = gr.one_with_everything(calls, packages, config)
    assert len(everything) <= 1
    assert gr.memory_mib(everything, packages, config.base_mib) <= config.memory_budget_mib + EPS


@PROPS
@given(packages_st(), calls_st, config_st)
def test_saves_at_least_the_best_single_candidate(packages, calls, config):
    saving = gr.expected_saving(gr.group(calls, packages, config), calls, packages)
    if config.max_sets >= 1:
        for cand in gr.candidate_sets(calls, packages, config):
            assert saving >= gr.expected_saving([cand], calls, packages) - EPS


@PROPS
@given(packages_st(), calls_st, config_st, st.floats(0, 500))
def test_more_budget_never_saves_less(packages, calls, config, extra):
    more = gr.GroupingConfig(max_sets=config.max_sets, memory_budget_mib=config.memory_budget_mib + extra,
                             base_mib=config.base_mib, max_call_sets=config.max_call_sets,
                             max_unions=config.max_unions)
    before = gr.expected_saving(gr.group(calls, packages, config), calls, packages)
    after = gr.expected_saving(gr.group(calls, packages, more), calls, packages)
    assert after >= before - EPS


@PROPS
@given(packages_st(), calls_st, config_st, st.randoms(use_true_random=False))
def test_sets_are_closed_subsets_of_the_measured_packages_and_deterministic(packages, calls, config, rnd):
    sets = gr.group(calls, packages, config)
    names = {p.distribution for p in packages}
    model = gr.Model.of(packages)
    for s in sets:
        assert s and s <= names
        assert model.set_of(model.mask(s)) == s  # closed under dependencies
    assert len(set(sets)) == len(sets)
    shuffled_packages, shuffled_calls = list(packages), list(calls)
    rnd.shuffle(shuffled_packages)
    rnd.shuffle(shuffled_calls)
    assert gr.group(shuffled_calls, shuffled_packages, config) == sets
