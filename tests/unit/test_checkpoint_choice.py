"""The online cost model (levers9.contracts.checkpoint_choice): properties over random calls,
candidates and workers against a reference written here, and concrete examples."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from levers9.contracts.catalogue import Catalogue, PackageTiming, SandboxSettings, SharedCheckpoint
from levers9.contracts.checkpoint_choice import (
    DEFAULT_IMPORT_SECONDS,
    DEFAULT_INSTALL_SECONDS,
    FETCH_BYTES_PER_SECOND,
    LOCALITY_BONUS_SECONDS,
    CallNeeds,
    Candidate,
    WorkerView,
    choose_checkpoint,
    closure,
    cold_candidate,
    distributions_for_imports,
    import_table,
    module_table,
    own_candidate,
    regret,
    requirement_name,
    settings_mismatch,
    shared_candidates,
)
from levers9.contracts.spec import CheckpointRef

DISTS = ["numpy", "pandas", "scipy", "scikit-learn", "torch", "requests", "matplotlib"]
DEPS = {"scikit-learn": frozenset({"numpy", "scipy"}), "scipy": frozenset({"numpy"}),
        "pandas": frozenset({"numpy"}), "matplotlib": frozenset({"numpy"})}
IDS = ["ck-a", "ck-b", "ck-c", "ck-d", "own-1"]

dist_sets = st.frozensets(st.sampled_from(DISTS))
secs = st.floats(0, 20, allow_nan=False, allow_infinity=False)


@st.composite
def calls(draw):
    return CallNeeds(
        distributions=draw(dist_sets),
        packages=draw(st.lists(st.sampled_from(DISTS + ["requests==2.31", "git+https://example.com/x/y"]),
                               max_size=3)),
        image_distributions=draw(dist_sets),
        import_seconds=draw(st.dictionaries(st.sampled_from(DISTS), st.floats(0, 3, allow_nan=False))),
        depends_on=DEPS if draw(st.booleans()) else {},
        cold_start_seconds=draw(secs))


@st.composite
def candidate_lists(draw):
    ids = draw(st.lists(st.sampled_from(IDS), unique=True, max_size=len(IDS)))
    out = [Candidate(kind="own" if i.startswith("own") else "shared", checkpoint_id=i,
                     distributions=draw(dist_sets), restore_seconds=draw(secs),
                     size_bytes=draw(st.integers(0, 4_000_000_000)), image_distributions=draw(dist_sets))
           for i in ids]
    if draw(st.booleans()):
        out.append(Candidate(kind="cold", restore_seconds=draw(secs), image_distributions=draw(dist_sets)))
    return out


@st.composite
def worker_lists(draw, min_size=0):
    n = draw(st.integers(min_size, 4))
    return [WorkerView(worker_id=f"w{i}", restorable=draw(st.frozensets(st.sampled_from(IDS))),
                       cached=draw(st.frozensets(st.sampled_from(IDS)))) for i in range(n)]


def reference_cost(call: CallNeeds, c: Candidate, w: WorkerView) -> float | None:
    """The model as the module's docstring states it, written again plainly."""
    if c.kind != "cold" and c.checkpoint_id not in w.restorable:
        return None
    needed = closure(call.distributions, call.depends_on)
    held = closure(c.distributions, call.depends_on)
    imports = sum(call.import_seconds.get(d, call.default_import_seconds) for d in needed - held)
    names = [requirement_name(p) for p in call.packages]
    required = {n for n in names if n} | (needed & call.image_distributions)
    installs = sum(call.install_seconds.get(d, call.default_install_seconds)
                   for d in required - c.image_distributions - held)
    installs += call.default_install_seconds * names.count("")
    cost = c.restore_seconds + imports + installs
    if c.kind != "cold":
        cost += -LOCALITY_BONUS_SECONDS if c.checkpoint_id in w.cached else c.size_bytes / FETCH_BYTES_PER_SECOND
    return max(0.0, cost)


def all_pairs(call, candidates, workers):
    pool = list(candidates) if any(c.kind == "cold" for c in candidates) else [*candidates, cold_candidate(call)]
    return [(c, w, cost) for c in pool for w in workers if (cost := reference_cost(call, c, w)) is not None]


def by_key(choice):
    return {e.candidate: e for e in choice.considered}


# ---- properties ---------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(call=calls(), candidates=candidate_lists(), workers=worker_lists())
def test_the_choice_is_the_cheapest_pair_and_never_none_with_a_worker(call, candidates, workers):
    choice = choose_checkpoint(call, candidates, workers)
    if not workers:
        assert choice is None
        return
    assert choice is not None  # cold is always a candidate
    pairs = all_pairs(call, candidates, workers)
    assert all(choice.estimate_seconds <= cost + 1e-9 for _, _, cost in pairs)
    assert math.isclose(choice.estimate_seconds, min(cost for _, _, cost in pairs), abs_tol=1e-9)
    assert reference_cost(call, choice.candidate, next(w for w in workers if w.worker_id == choice.worker_id)) \
        == pytest.approx(choice.estimate_seconds, abs=1e-9)
    assert choice.considered[0] == choice.estimate
    assert len(choice.considered) <= 5
    assert [e.seconds for e in choice.considered] == sorted(e.seconds for e in choice.considered)
    assert len({e.candidate for e in choice.considered}) == len(choice.considered)


@settings(max_examples=300, deadline=None)
@given(call=calls(), candidates=candidate_lists(), workers=worker_lists(min_size=1))
def test_the_runner_up_is_another_candidate_never_cheaper(call, candidates, workers):
    choice = choose_checkpoint(call, candidates, workers)
    assert choice is not None
    if choice.runner_up is not None:
        assert choice.runner_up.seconds >= choice.estimate_seconds
        assert choice.runner_up.candidate != choice.candidate.key
        assert choice.runner_up == choice.considered[1]
    else:
        assert len(choice.considered) == 1


@settings(max_examples=200, deadline=None)
@given(call=calls(), candidates=candidate_lists(), workers=worker_lists(min_size=1), seed=st.integers(0, 1000))
def test_deterministic_whatever_the_order(call, candidates, workers, seed):
    first = choose_checkpoint(call, candidates, workers)
    rng = random.Random(seed)
    shuffled_c, shuffled_w = list(candidates), list(workers)
    rng.shuffle(shuffled_c)
    rng.shuffle(shuffled_w)
    assert choose_checkpoint(call, shuffled_c, shuffled_w) == first
    assert choose_checkpoint(call, candidates, workers) == first


@settings(max_examples=300, deadline=None)
@given(call=calls(), candidates=candidate_lists(), workers=worker_lists(min_size=1),
       more=candidate_lists())
def test_adding_candidates_never_raises_the_chosen_estimate(call, candidates, workers, more):
    before = choose_checkpoint(call, candidates, workers)
    ids = {c.key for c in candidates}
    extra = [c for c in more if c.key not in ids and c.kind != "cold"]
    after = choose_checkpoint(call, candidates + extra, workers)
    assert before is not None and after is not None
    assert after.estimate_seconds <= before.estimate_seconds


@settings(max_examples=300, deadline=None)
@given(call=calls(), candidates=candidate_lists(), workers=worker_lists(min_size=1),
       index=st.integers(0, 3), ckpt=st.sampled_from(IDS))
def test_locality_never_makes_the_choice_worse(call, candidates, workers, index, ckpt):
    before = choose_checkpoint(call, candidates, workers)
    i = index % len(workers)
    warmer = list(workers)
    warmer[i] = WorkerView(worker_id=workers[i].worker_id, restorable=workers[i].restorable,
                           cached=workers[i].cached | {ckpt})
    after = choose_checkpoint(call, candidates, warmer)
    assert before is not None and after is not None
    assert after.estimate_seconds <= before.estimate_seconds


@settings(max_examples=300, deadline=None)
@given(call=calls(), small=dist_sets, extra=dist_sets, restore=secs, size=st.integers(0, 10**9),
       image=dist_sets)
def test_holding_more_imports_never_costs_more_in_imports(call, small, extra, restore, size, image):
    a = Candidate(kind="shared", checkpoint_id="ck-big", distributions=small | extra, restore_seconds=restore,
                  size_bytes=size, image_distributions=image)
    b = Candidate(kind="shared", checkpoint_id="ck-small", distributions=small, restore_seconds=restore,
                  size_bytes=size, image_distributions=image)
    w = WorkerView(worker_id="w0", restorable=frozenset({"ck-big", "ck-small"}))
    choice = choose_checkpoint(call, [a, b], [w])
    assert choice is not None
    costs = by_key(choice)
    assert costs["shared:ck-big"].imports <= costs["shared:ck-small"].imports
    assert costs["shared:ck-big"].seconds <= costs["shared:ck-small"].seconds
    assert set(costs["shared:ck-big"].missing_imports) <= set(costs["shared:ck-small"].missing_imports)


def test_a_distribution_is_counted_once_however_many_imports_need_it():
    call = CallNeeds(distributions=frozenset({"pandas", "scikit-learn"}), depends_on=DEPS,
                     import_seconds={"numpy": 0.1, "scipy": 0.2, "pandas": 0.3, "scikit-learn": 0.4})
    choice = choose_checkpoint(call, [], [WorkerView(worker_id="w0")])
    assert choice is not None and choice.candidate.kind == "cold"
    assert choice.estimate.imports == pytest.approx(1.0)  # numpy once, though pandas and sklearn both import it
    assert choice.estimate.missing_imports == ["numpy", "pandas", "scikit-learn", "scipy"]


# ---- sandbox settings ----------------------------------------------------------------------------

FEATURES = ["avx", "avx2", "avx512f", "sse4_2"]
sandbox_settings = st.builds(
    SandboxSettings, network_mode=st.sampled_from(["bridge", "host", "none"]), overlay=st.booleans(),
    lazy_image=st.booleans(), gpu=st.sampled_from(["", "H100", "A10G"]),
    cpu_features=st.lists(st.sampled_from(FEATURES), unique=True), python=st.sampled_from(["3.11", "3.12", ""]))


@settings(max_examples=500)
@given(captured=sandbox_settings, mine=sandbox_settings)
def test_settings_mismatch_is_empty_iff_compatible(captured, mine):
    compatible = (captured.network_mode == mine.network_mode and captured.overlay == mine.overlay
                  and captured.lazy_image == mine.lazy_image and captured.gpu == mine.gpu
                  and set(captured.cpu_features) <= set(mine.cpu_features) and captured.python == mine.python)
    assert (settings_mismatch(captured, mine) == "") == compatible
    assert settings_mismatch(captured, captured) == ""


def test_settings_mismatch_names_each_difference():
    captured = SandboxSettings(network_mode="bridge", overlay=True, lazy_image=True, gpu="H100",
                               cpu_features=["avx2", "avx512f"], python="3.12")
    mine = SandboxSettings(network_mode="host", overlay=False, lazy_image=False, gpu="",
                           cpu_features=["avx2", "sse4_2"], python="3.11")
    why = settings_mismatch(captured, mine)
    for part in ("network mode 'host' here, 'bridge' at capture", "overlay off here", "lazy image off here",
                 "GPU 'none' here, 'H100' at capture", "CPU features missing here: avx512f",
                 "Python 3.11 here, 3.12 at capture"):
        assert part in why
    assert "sse4_2" not in why  # an extra feature on the worker is fine
    more = SandboxSettings(network_mode="bridge", gpu="H100", cpu_features=["avx2", "avx512f", "amx"],
                           python="3.12")
    assert settings_mismatch(captured, more) == ""


# ---- concrete examples ---------------------------------------------------------------------------

def science_catalogue() -> Catalogue:
    pkgs = [PackageTiming(distribution="numpy", modules=["numpy"], import_seconds=0.12),
            PackageTiming(distribution="scipy", modules=["scipy"], import_seconds=0.35, depends_on=["numpy"]),
            PackageTiming(distribution="pandas", modules=["pandas"], import_seconds=0.6, depends_on=["numpy"]),
            PackageTiming(distribution="scikit-learn", modules=["sklearn"], import_seconds=1.1,
                          depends_on=["numpy", "scipy"]),
            PackageTiming(distribution="torch", modules=["torch"], import_seconds=2.5, depends_on=["numpy"])]
    by = {p.distribution: p for p in pkgs}
    return Catalogue(catalogue_id="cat-1", image_id="img-cat", packages=pkgs, checkpoints=[
        SharedCheckpoint(checkpoint_id="sci", image_id="img-cat", restore_seconds=0.4, size_bytes=300_000_000,
                         packages=[by["numpy"], by["scipy"], by["pandas"], by["scikit-learn"]]),
        SharedCheckpoint(checkpoint_id="torch", image_id="img-cat", restore_seconds=0.9, size_bytes=900_000_000,
                         packages=[by["numpy"], by["torch"]]),
        SharedCheckpoint(checkpoint_id="gpu-only", flavor="gpu", image_id="img-cat", packages=[by["torch"]])])


def needs_for(imports, catalogue, **kw) -> CallNeeds:
    own, deps = import_table(catalogue.packages)
    return CallNeeds(distributions=distributions_for_imports(imports, module_table(catalogue.packages)),
                     import_seconds=own, depends_on=deps, **kw)


def test_a_numpy_pandas_sklearn_call_picks_the_shared_checkpoint_holding_them():
    cat = science_catalogue()
    call = needs_for(["numpy", "pandas", "sklearn.linear_model", "os", "json"], cat,
                     image_distributions=frozenset({"numpy", "pandas", "scikit-learn", "scipy"}))
    assert call.distributions == {"numpy", "pandas", "scikit-learn"}  # stdlib dropped, sklearn mapped
    candidates = shared_candidates(cat, "cpu", {"sci", "torch", "gpu-only"})
    assert [c.checkpoint_id for c in candidates] == ["sci", "torch"]  # another flavor is not a candidate
    w = WorkerView(worker_id="w0", restorable=frozenset({"sci", "torch"}), cached=frozenset({"sci"}))
    choice = choose_checkpoint(call, candidates, [w])
    assert choice is not None
    assert (choice.candidate.kind, choice.checkpoint, choice.worker_id) == ("shared", "sci", "w0")
    assert choice.estimate.imports == 0 and choice.estimate.installs == 0
    assert choice.estimate_seconds == pytest.approx(0.4 - LOCALITY_BONUS_SECONDS)
    cold = by_key(choice)["cold"]
    assert cold.imports == pytest.approx(0.12 + 0.6 - 0.12 + 1.1 - 0.12 - (0.35 - 0.12) + 0.35 - 0.12)
    assert choice.runner_up is not None and choice.runner_up.seconds >= choice.estimate_seconds


def test_a_call_importing_nothing_picks_cold_or_the_cheapest_restore():
    call = CallNeeds(cold_start_seconds=1.5)
    fast = Candidate(kind="shared", checkpoint_id="fast", restore_seconds=0.3)
    slow = Candidate(kind="shared", checkpoint_id="slow", restore_seconds=2.0)
    w = WorkerView(worker_id="w0", restorable=frozenset({"fast", "slow"}), cached=frozenset({"fast", "slow"}))
    choice = choose_checkpoint(call, [slow, fast], [w])
    assert choice is not None and choice.checkpoint == "fast"
    only_slow = choose_checkpoint(call, [slow], [w])
    assert only_slow is not None and only_slow.candidate.kind == "cold"
    assert only_slow.runner_up is not None and only_slow.runner_up.candidate == "shared:slow"


def test_a_worker_lacking_the_blob_loses_to_one_holding_it():
    call = CallNeeds(distributions=frozenset({"numpy"}))
    ck = Candidate(kind="shared", checkpoint_id="sci", distributions=frozenset({"numpy"}), restore_seconds=0.4,
                   size_bytes=400_000_000)
    cold_node = WorkerView(worker_id="a", restorable=frozenset({"sci"}))
    warm_node = WorkerView(worker_id="b", restorable=frozenset({"sci"}), cached=frozenset({"sci"}))
    choice = choose_checkpoint(call, [ck], [cold_node, warm_node])
    assert choice is not None and (choice.checkpoint, choice.worker_id) == ("sci", "b")
    unknown_size = Candidate(kind="shared", checkpoint_id="sci", restore_seconds=0.4)
    choice = choose_checkpoint(call, [unknown_size], [cold_node, warm_node])
    assert choice is not None and choice.worker_id == "b"  # the bonus alone decides
    alone = choose_checkpoint(call, [ck], [cold_node])
    assert alone is not None and alone.candidate.kind == "cold"  # 1.5 s cold beats 0.4 s + 2 s fetching the blob
    assert by_key(alone)["shared:sci"].fetch == pytest.approx(400_000_000 / FETCH_BYTES_PER_SECOND)


def test_ties_go_to_own_then_shared_then_cold_then_ids():
    call = CallNeeds(cold_start_seconds=1.0)
    ref = CheckpointRef(checkpoint_id="mine")
    own = own_candidate(call, ref, restore_seconds=1.0)
    shared = [Candidate(kind="shared", checkpoint_id=i, restore_seconds=1.0) for i in ("b", "a")]
    ws = [WorkerView(worker_id=i, restorable=frozenset({"mine", "a", "b"})) for i in ("w2", "w1")]
    choice = choose_checkpoint(call, [*shared, own], ws)
    assert choice is not None
    assert [(e.kind, e.checkpoint_id, e.worker_id) for e in choice.considered] == [
        ("own", "mine", "w1"), ("shared", "a", "w1"), ("shared", "b", "w1"), ("cold", "", "w1")]


def test_packages_the_image_lacks_cost_an_install_and_shared_checkpoints_off_means_none_passed():
    cat = science_catalogue()
    call = needs_for(["pandas", "mylib"], cat, packages=["polars>=1", "pandas"],
                     image_distributions=frozenset({"numpy", "pandas", "mylib"}))
    cold = by_key(choose_checkpoint(call, [], [WorkerView(worker_id="w0")]))["cold"]
    assert cold.missing_installs == ["polars"]  # pandas and mylib are in the function's image
    assert cold.installs == DEFAULT_INSTALL_SECONDS
    assert cold.imports == pytest.approx(0.12 + (0.6 - 0.12) + DEFAULT_IMPORT_SECONDS)  # mylib: unmeasured
    shared = shared_candidates(cat, "cpu", {"sci"})
    choice = choose_checkpoint(call, shared, [WorkerView(worker_id="w0", restorable=frozenset({"sci"}))])
    assert choice is not None
    # mylib is in the function's image, not the catalogue's: on a shared checkpoint it is installed
    assert by_key(choice)["shared:sci"].missing_installs == ["mylib", "polars"]
    # shared_checkpoints=False: the scheduler passes no shared candidates, so it is cold (or own)
    off = choose_checkpoint(call, [], [WorkerView(worker_id="w0", restorable=frozenset({"sci"}))])
    assert off is not None and off.candidate.kind == "cold"


def test_flavor_and_executor_generation_must_match():
    call = CallNeeds(flavor="gpu", executor_generation=2, cold_start_seconds=9.0)
    ws = [WorkerView(worker_id="w0", restorable=frozenset({"cpu", "old", "ok"}))]
    cands = [Candidate(kind="shared", checkpoint_id="cpu", flavor="cpu"),
             Candidate(kind="shared", checkpoint_id="old", flavor="gpu", executor_generation=1),
             Candidate(kind="shared", checkpoint_id="ok", flavor="gpu", executor_generation=2, restore_seconds=1)]
    choice = choose_checkpoint(call, cands, ws)
    assert choice is not None
    assert [e.candidate for e in choice.considered] == ["shared:ok", "cold"]


def test_no_worker_no_choice_and_a_checkpoint_no_worker_can_restore_is_skipped():
    ck = Candidate(kind="shared", checkpoint_id="x")
    assert choose_checkpoint(CallNeeds(), [ck], []) is None
    choice = choose_checkpoint(CallNeeds(), [ck], [WorkerView(worker_id="w0")])
    assert choice is not None and [e.candidate for e in choice.considered] == ["cold"]


# ---- names, measurements, regret -----------------------------------------------------------------

@pytest.mark.parametrize("req,name", [
    ("numpy", "numpy"), ("NumPy==1.26", "numpy"), ("scikit_learn>=1.3", "scikit-learn"),
    ("foo.bar[extra]~=2; python_version > '3'", "foo-bar"), ("pkg @ https://x.org/pkg.whl", "pkg"),
    ("git+https://github.com/o/r@v1", ""), ("https://x.org/a-1.0.whl", ""), ("./local", ""),
])
def test_requirement_name(req, name):
    assert requirement_name(req) == name


def test_import_table_gives_each_distribution_its_own_time():
    own, deps = import_table(science_catalogue().packages)
    assert own["numpy"] == pytest.approx(0.12)
    assert own["scipy"] == pytest.approx(0.23)
    assert own["scikit-learn"] == pytest.approx(1.1 - 0.12 - 0.23)
    assert deps["scikit-learn"] == {"numpy", "scipy"}
    cyclic, _ = import_table([PackageTiming(distribution="a", import_seconds=1.0, depends_on=["b"]),
                              PackageTiming(distribution="b", import_seconds=0.4, depends_on=["a"])])
    assert all(v >= 0 for v in cyclic.values())


def test_regret():
    measured = {"cold": 2.0, "shared:sci": 0.5, "own:mine": 1.0}
    assert regret("shared:sci", measured) == 0.0
    assert regret("own:mine", measured) == pytest.approx(1.0)
    choice = choose_checkpoint(CallNeeds(), [], [WorkerView(worker_id="w0")])
    assert choice is not None and regret(choice, measured) == pytest.approx(3.0)
    with pytest.raises(KeyError):
        regret("shared:gone", measured)
