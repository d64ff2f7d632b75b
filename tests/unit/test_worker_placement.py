"""What the worker makes of a placement (pure): the runner's environment from the typed spec, and
whether a delivered placement is stale (seen overtaken by this worker's own consumer)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts.spec import Code, DeploymentSpec, Scaling
from levers9.worker.lifecycle.placement import Overtaken, Running, runner_env


def spec(**kw) -> DeploymentSpec:
    values = dict(name="hello", code=Code(module="app", handler="handler", on_start="build", kind="asgi"),
                  env={"A": "1", "LEVERS9_RUNNER_MODULE": "not this"}, timeout_seconds=30,
                  scaling=Scaling(concurrency=4, keep_warm_seconds=7))
    values.update(kw)
    return DeploymentSpec(**values)


def test_runner_env_from_the_spec():
    env = runner_env(spec(), {"TOKEN": "s3cret", "A": "from the secret"}, container_id="c1", deployment_id="d1",
                     max_body_bytes=1024)
    assert env == {"A": "from the secret", "TOKEN": "s3cret", "LEVERS9_RUNNER_MODULE": "app",
                   "LEVERS9_RUNNER_HANDLER": "handler", "LEVERS9_RUNNER_KIND": "asgi",
                   "LEVERS9_RUNNER_ON_START": "build", "LEVERS9_RUNNER_CONCURRENCY": "4",
                   "LEVERS9_RUNNER_TIMEOUT": "30", "LEVERS9_RUNNER_MAX_BODY": "1024",
                   "LEVERS9_CONTAINER_ID": "c1", "LEVERS9_DEPLOYMENT_ID": "d1"}


def test_running_takes_keep_warm_from_the_spec():
    assert Running("c", "w", "d", "corr", 0.0, spec=spec()).keep_warm_seconds == 7
    assert Running("c", "w", "", "corr", 0.0).keep_warm_seconds == 0


def test_the_autoscaler_stops_a_deployed_functions_sandbox_the_keep_warm_a_sessions_or_an_ad_hoc_one():
    from levers9.worker.lifecycle.containers import autoscaled

    deployed = spec(code=Code(kind="function", module="stats", handler="zscore"))
    adhoc = spec(code=Code(kind="function", module="", handler=""))
    assert autoscaled(Running("c", "w", "d", "corr", 0.0, spec=deployed))
    assert not autoscaled(Running("c", "w", "d", "corr", 0.0, spec=deployed, session_id="s1"))
    assert not autoscaled(Running("c", "w", "d", "corr", 0.0, spec=adhoc))


def test_a_redelivered_placement_is_stale_a_new_one_is_not():
    seen = Overtaken()
    assert seen.stale("c", 10) is None
    seen.saw("c", 10, "it was started here already")
    assert seen.stale("c", 10) == "it was started here already (stream sequence 10)"
    seen.saw("c", 20, "its stop was requested")
    assert seen.stale("c", 15) == "its stop was requested (stream sequence 20)"
    assert seen.stale("c", 30) is None  # placed again after its stop: a new placement
    assert seen.stale("other", 5) is None


events = st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 1000)), max_size=40)


@given(events=events, container=st.sampled_from("abcd"), placement=st.integers(1, 1000))
def test_stale_exactly_when_overtaken_at_or_after_the_placement(events, container, placement):
    seen = Overtaken()
    for cid, seq in events:
        seen.saw(cid, seq, "moved on")
    latest = max((seq for cid, seq in events if cid == container), default=0)
    assert (seen.stale(container, placement) is not None) == (latest >= placement)


@given(events=events, limit=st.integers(1, 3))
def test_remembers_at_most_its_limit(events, limit):
    seen = Overtaken(limit)
    for cid, seq in events:
        seen.saw(cid, seq, "moved on")
        assert len(seen) <= limit
