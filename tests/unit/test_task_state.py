"""The pure decisions of task queues (levers9.contracts.task_state), proven by properties: retry
backoff, TTL expiry, what an attempt's end leads to, the queue depth, and that the append protocol
records at most one outcome however runners, redeliveries and cancels interleave."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts import events as E
from levers9.contracts.task_state import (
    ENDED,
    MAX_BACKOFF_S,
    PLATFORM_RETRIES,
    Attempted,
    QueueDepth,
    TaskState,
    after_attempt,
    apply,
    expired,
    fold,
    retry_delay,
)

IDS = {"task_id": "t1", "deployment_id": "d-v1"}


def enqueued(retries: int = 0, backoff: float = 1.0, at: float = 1000.0, ttl: float = 60.0) -> E.TaskEnqueued:
    return E.TaskEnqueued(**IDS, queue="d", enqueued_at=at, ttl_seconds=ttl, retries=retries, retry_backoff=backoff)


@given(st.floats(0, 3600), st.integers(1, 60))
def test_retry_delay_starts_at_the_backoff_doubles_and_is_capped(backoff, attempt):
    d = retry_delay(backoff, attempt)
    assert 0 <= d <= MAX_BACKOFF_S
    assert retry_delay(backoff, 1) == min(MAX_BACKOFF_S, backoff)
    assert retry_delay(backoff, attempt + 1) >= d


@given(st.floats(0, 1e9), st.floats(0.001, 1e6), st.floats(-1e6, 1e6))
def test_a_task_expires_only_once_it_waited_longer_than_its_ttl(at, ttl, waited):
    now = at + waited
    assert expired(enqueued(at=at, ttl=ttl), now) == (now - at > ttl)
    assert not expired(enqueued(at=at, ttl=ttl), at)  # a fresh task never has


def run_to_the_end(retries: int, kinds: list[str]) -> tuple[list[E.Event], TaskState]:
    """Attempts ending as `kinds` say (then ok), folded as the runner appends them."""
    events: list[E.Event] = [enqueued(retries=retries)]
    state = fold(events)
    for kind in [*kinds, "ok"]:
        events.append(E.TaskStarted(**IDS, attempt=state.attempt, retries_used=state.retries_used,
                                    platform_retries=state.platform_retries))
        state = fold(events)
        nxt = after_attempt(state, Attempted(ok=kind == "ok", kind=kind), now=0.0)
        if nxt.kind == "retry":
            events.append(E.TaskRetried(**IDS, attempt=state.attempt + 1, not_before=nxt.not_before,
                                        counted=nxt.counted, retries_used=nxt.retries_used,
                                        platform_retries=nxt.platform_retries))
            state = fold(events)
            continue
        outcome = {"succeeded": E.TaskSucceeded(**IDS), "failed": E.TaskFailed(**IDS),
                   "cancelled": E.TaskCancelled(**IDS)}[nxt.kind]
        events.append(outcome)
        return events, fold(events)
    raise AssertionError("unreachable")


@given(st.integers(0, 10), st.lists(st.sampled_from(["error", "timeout", "failed"]), max_size=30))
def test_the_function_s_failures_spend_its_retries_and_the_platform_s_do_not(retries, kinds):
    events, state = run_to_the_end(retries, kinds)
    assert state.done
    counted = sum(isinstance(e, E.TaskRetried) and e.counted for e in events)
    platform = sum(isinstance(e, E.TaskRetried) and not e.counted for e in events)
    assert counted <= retries and platform <= PLATFORM_RETRIES
    own = [k for k in kinds if k != "failed"]
    if len(own) <= retries and kinds.count("failed") <= PLATFORM_RETRIES:
        assert state.status == "succeeded"  # every failure had a retry left: the last attempt's ok counts
    else:
        assert state.status == "failed"
    assert sum(isinstance(e, (E.TaskSucceeded, E.TaskFailed, E.TaskCancelled)) for e in events) == 1


def test_a_cancelled_attempt_is_never_retried():
    state = apply(fold([enqueued(retries=5)]), E.TaskStarted(**IDS, attempt=1))
    assert after_attempt(state, Attempted(ok=False, kind="cancelled"), 0.0).kind == "cancelled"


def test_the_retry_waits_its_backoff():
    state = apply(fold([enqueued(retries=3, backoff=2.0)]), E.TaskStarted(**IDS, attempt=1))
    nxt = after_attempt(state, Attempted(ok=False, kind="error"), now=100.0)
    assert nxt.kind == "retry" and nxt.not_before == 102.0 and nxt.retries_used == 1


@given(st.lists(st.sampled_from(["Started", "Succeeded", "Failed", "Cancelled", "Retried"]), max_size=12))
def test_the_first_outcome_stands(steps):
    make = {"Started": lambda: E.TaskStarted(**IDS), "Succeeded": lambda: E.TaskSucceeded(**IDS),
            "Failed": lambda: E.TaskFailed(**IDS), "Cancelled": lambda: E.TaskCancelled(**IDS, reason="x"),
            "Retried": lambda: E.TaskRetried(**IDS, attempt=2, not_before=0.0)}
    events = [enqueued(), *(make[s]() for s in steps)]
    state = fold(events)
    first = next((e for e in events if type(e).__name__.replace("Task", "") in ("Succeeded", "Failed", "Cancelled")),
                 None)
    assert state.ended is first


# ---- the append protocol: at most one outcome --------------------------------------------------------

@dataclass
class Log:
    """One task aggregate with JetStream's expected-last-sequence rule."""
    events: list[E.Event] = field(default_factory=lambda: [enqueued(retries=1)])

    @property
    def last_seq(self) -> int:
        return len(self.events)

    def append(self, event: E.Event, expected: int) -> bool:
        if expected != self.last_seq:
            return False
        self.events.append(event)
        return True


@dataclass
class Runner:
    """A runner holding a (re)delivered task: load, start, then (later) record how it ended."""
    started_seq: int = 0
    state: TaskState | None = None

    def start(self, log: Log) -> None:
        state = fold(log.events)
        if state.done or self.started_seq:
            return
        event = E.TaskStarted(**IDS, attempt=state.attempt, retries_used=state.retries_used,
                              platform_retries=state.platform_retries)
        if log.append(event, log.last_seq):
            self.started_seq, self.state = log.last_seq, fold(log.events)

    def finish(self, log: Log, ok: bool) -> None:
        if not self.started_seq or self.state is None:
            return
        nxt = after_attempt(self.state, Attempted(ok=ok, kind="ok" if ok else "error"), 0.0)
        event = E.TaskSucceeded(**IDS) if nxt.kind == "succeeded" else E.TaskFailed(**IDS) \
            if nxt.kind == "failed" else E.TaskRetried(**IDS, attempt=self.state.attempt + 1, not_before=0.0,
                                                       retries_used=nxt.retries_used)
        log.append(event, self.started_seq)  # a conflict: someone moved the task on; this outcome is dropped
        self.started_seq, self.state = 0, None


def cancel(log: Log) -> None:
    if not fold(log.events).done:
        log.append(E.TaskCancelled(**IDS, reason="user"), log.last_seq)


@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["start", "ok", "error", "cancel"])), max_size=40))
def test_runners_redeliveries_and_cancels_record_at_most_one_outcome(steps):
    log, runners = Log(), [Runner(), Runner(), Runner()]
    for who, op in steps:
        if op == "start":
            runners[who].start(log)
        elif op == "cancel":
            cancel(log)
        else:
            runners[who].finish(log, ok=op == "ok")
    outcomes = [e for e in log.events if isinstance(e, (E.TaskSucceeded, E.TaskFailed, E.TaskCancelled))]
    assert len(outcomes) <= 1
    if outcomes:
        assert log.events[-1] is outcomes[0]  # nothing is appended after the outcome
        assert fold(log.events).status in ENDED


# ---- queue depth ------------------------------------------------------------------------------------

@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["Enqueued", "Started", "Retried", "Succeeded"])),
                max_size=60))
def test_queue_depth_counts_tasks_not_yet_ended(steps):
    depth = QueueDepth()
    states: dict[str, TaskState] = {}
    for n, kind in steps:
        tid = f"t{n}"
        ids = {"task_id": tid, "deployment_id": "d-v1"}
        event = {"Enqueued": lambda: E.TaskEnqueued(**ids, queue="d", enqueued_at=0.0),  # noqa: B023
                 "Started": lambda: E.TaskStarted(**ids),  # noqa: B023
                 "Retried": lambda: E.TaskRetried(**ids, attempt=2, not_before=0.0),  # noqa: B023
                 "Succeeded": lambda: E.TaskSucceeded(**ids)}[kind]()  # noqa: B023
        if tid not in states and kind != "Enqueued":
            continue  # a task's events begin with its TaskEnqueued
        if kind == "Enqueued" and tid in states:
            continue
        states[tid] = apply(states.get(tid, TaskState()), event)
        depth.apply(event)
    waiting, running = depth.depth("d-v1")
    live = [s for s in states.values() if not s.done]
    assert running == sum(s.status == "running" for s in live)
    assert waiting == sum(s.status in ("queued", "retrying") for s in live)
    assert depth.depth("other") == (0, 0)
