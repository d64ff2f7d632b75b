"""The one checkpoint policy (gateway, scheduler, worker): restore or cold and why, whether to dump,
the one-GPU rule."""

from __future__ import annotations

from contracts_strategies import checkpoint_refs, gpu_types, specs
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts.checkpoint_policy import (
    MAX_CHECKPOINT_GPUS,
    cold_fallback_note,
    dump_choice,
    gpu_rule,
    restore_choice,
    restore_note,
)
from levers9.contracts.spec import Code, DeploymentSpec, Resources

refs = st.lists(checkpoint_refs, max_size=4)
flags = st.booleans()


def spec_with(gpu: list[str] | None = None, gpu_count: int = 0, enabled: bool = True) -> DeploymentSpec:
    return DeploymentSpec(name="ep", code=Code(module="app", handler="ep"), checkpoint_enabled=enabled,
                          resources=Resources(gpu=gpu or [], gpu_count=gpu_count))


# ---- restore or cold (the gateway) -------------------------------------------------------------

@given(spec=specs, available=refs)
def test_restore_only_when_enabled_one_gpu_at_most_and_one_available_then_the_newest(spec, available):
    choice = restore_choice(spec, available)
    restorable = spec.checkpoint_enabled and spec.resources.gpus <= MAX_CHECKPOINT_GPUS and bool(available)
    assert (choice.checkpoint is not None) == restorable
    if restorable:
        assert choice.checkpoint == available[0]  # the newest: the caller passes them newest first
        assert choice.note == ""
    else:
        assert choice.note.startswith("cold: ")


@given(spec=specs, available=refs)
def test_a_cold_start_says_why(spec, available):
    note = restore_choice(spec, available).note
    if not spec.checkpoint_enabled:
        assert note == "cold: checkpoint_enabled is off"
    elif spec.resources.gpus > MAX_CHECKPOINT_GPUS:
        assert note == f"cold: {spec.resources.gpus} GPUs (a checkpoint holds at most {MAX_CHECKPOINT_GPUS})"
    elif not available:
        assert "no checkpoint of this version yet" in note


@given(ref=checkpoint_refs, why=st.text(max_size=40))
def test_the_schedulers_fallback_is_cold_and_names_the_checkpoint(ref, why):
    note = cold_fallback_note(ref, why)
    assert note.startswith("cold: ") and ref.checkpoint_id in note and why in note
    assert ref.checkpoint_id in restore_note(ref) and not restore_note(ref).startswith("cold")


# ---- the one-GPU rule --------------------------------------------------------------------------

@given(gpu=st.lists(gpu_types, max_size=3), count=st.integers(0, 16))
def test_the_gpu_rule_allows_one_gpu_at_most(gpu, count):
    spec = spec_with(gpu, count)
    why = gpu_rule(spec)
    assert (why == "") == (spec.resources.gpus <= 1)
    if why:
        assert why.startswith(f"{spec.resources.gpus} GPUs")


def test_a_named_gpu_type_counts_as_one_gpu():
    assert gpu_rule(spec_with(["L4"])) == ""
    assert gpu_rule(spec_with(["L4", "T4"], 2)) == "2 GPUs (a checkpoint holds at most 1)"
    assert restore_choice(spec_with(gpu_count=2), []).note == "cold: 2 GPUs (a checkpoint holds at most 1)"


# ---- whether to dump (the worker) --------------------------------------------------------------

@given(spec=specs, restored=flags, manual=flags, has=flags, claimed=flags)
def test_never_a_dump_without_ready_criu_or_with_more_than_one_gpu(spec, restored, manual, has, claimed):
    no_criu = dump_choice(spec, criu_ready=False, restored=restored, manual=manual, version_has_checkpoint=has,
                          claimed_elsewhere=claimed)
    assert not no_criu.dump and "CRIU" in no_criu.why
    if spec.resources.gpus > 1:
        many = dump_choice(spec, criu_ready=True, restored=restored, manual=manual, version_has_checkpoint=has,
                           claimed_elsewhere=claimed)
        assert not many.dump and "GPUs" in many.why


@given(restored=flags, manual=flags, has=flags, claimed=flags, criu=flags)
def test_no_dump_of_a_container_that_runs_no_deployment(restored, manual, has, claimed, criu):
    choice = dump_choice(None, criu_ready=criu, restored=restored, manual=manual, version_has_checkpoint=has,
                         claimed_elsewhere=claimed)
    assert not choice.dump and choice.why


@given(spec=specs, restored=flags, has=flags, claimed=flags)
def test_manual_overrides_the_once_per_version_rules_but_not_criu_or_gpus(spec, restored, has, claimed):
    choice = dump_choice(spec, criu_ready=True, restored=restored, manual=True, version_has_checkpoint=has,
                         claimed_elsewhere=claimed)
    assert choice.dump == (spec.resources.gpus <= MAX_CHECKPOINT_GPUS)
    if choice.dump:
        assert choice.why == "asked for by a user"


@given(spec=specs, restored=flags, has=flags, claimed=flags)
def test_an_automatic_dump_is_the_first_cold_start_of_an_enabled_version(spec, restored, has, claimed):
    choice = dump_choice(spec, criu_ready=True, restored=restored, manual=False, version_has_checkpoint=has,
                         claimed_elsewhere=claimed)
    expected = (spec.checkpoint_enabled and spec.resources.gpus <= MAX_CHECKPOINT_GPUS and not restored
                and not has and not claimed)
    assert choice.dump == expected
    assert choice.why  # always says why


def test_each_reason_not_to_dump_is_named():
    spec = spec_with()
    assert dump_choice(spec, criu_ready=True, restored=False).why == "first cold start of this version"
    assert dump_choice(spec, criu_ready=True, restored=True).why == "restored from a checkpoint already"
    assert dump_choice(spec, criu_ready=True, restored=False, version_has_checkpoint=True).why == \
        "this deployment version has a checkpoint"
    assert dump_choice(spec, criu_ready=True, restored=False, claimed_elsewhere=True).why == \
        "another worker is dumping this version"
    assert dump_choice(spec_with(enabled=False), criu_ready=True, restored=False).why == "checkpoint_enabled is off"
