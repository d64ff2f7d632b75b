"""Whose fault a failed restore is (levers9.contracts.checkpoint_policy.restore_failure_verdict): only
the checkpoint's own fault marks it failed; anything transient keeps it available for the next start."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts.checkpoint_policy import (
    CONTENT,
    MISSING,
    NODE_CACHE,
    RUNTIME,
    UNREACHABLE,
    RestoreFailure,
    restore_failure_verdict,
)

failures = st.builds(RestoreFailure, stage=st.sampled_from([NODE_CACHE, RUNTIME]), answered=st.booleans(),
                     timed_out=st.booleans(), status=st.sampled_from([0, 200, 400, 404, 409, 422, 429, 500, 502,
                                                                      503, 504]),
                     fault=st.sampled_from(["", CONTENT, MISSING, UNREACHABLE]), transient_cause=st.booleans())


@given(f=failures)
def test_nothing_that_did_not_answer_or_timed_out_is_ever_the_checkpoint_s_fault(f):
    if not f.answered or f.timed_out:
        assert not restore_failure_verdict(f).its_own


@given(f=failures)
def test_the_node_cache_s_own_word_decides_when_it_gives_one(f):
    if f.stage != NODE_CACHE or not f.answered or f.timed_out or not f.fault:
        return
    assert restore_failure_verdict(f).its_own == (f.fault in (CONTENT, MISSING))


@given(status=st.integers(100, 599))
def test_without_its_word_a_try_again_status_is_transient_and_a_refusal_is_not(status):
    verdict = restore_failure_verdict(RestoreFailure(NODE_CACHE, status=status))
    assert verdict.its_own == (status < 500 and status not in (408, 425, 429))
    assert verdict.why


@given(transient=st.booleans())
def test_the_runtime_refusing_an_image_is_its_own_fault_unless_a_connection_caused_it(transient):
    assert restore_failure_verdict(RestoreFailure(RUNTIME, transient_cause=transient)).its_own == (not transient)


def test_the_cases_of_the_issue():
    unreachable_cache = RestoreFailure(NODE_CACHE, answered=False)
    s3_down = RestoreFailure(NODE_CACHE, status=503, fault=UNREACHABLE)
    corrupt = RestoreFailure(NODE_CACHE, status=502, fault=CONTENT)
    criu_refused = RestoreFailure(RUNTIME)
    timeout = RestoreFailure(RUNTIME, timed_out=True)
    assert [restore_failure_verdict(f).its_own for f in (unreachable_cache, s3_down, corrupt, criu_refused, timeout)] \
        == [False, False, True, True, False]
