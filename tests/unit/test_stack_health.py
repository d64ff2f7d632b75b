"""`levers9 up` and a service that is running: a healthy one that answers slowly once (a loaded machine)
is kept, not restarted; one that never answers 200 is restarted. No process is started here: the pid
check and the health probe are stand-ins."""

from __future__ import annotations

import pytest

from levers9.runtime.config import Settings
from levers9.stack import procs
from levers9.stack.supervisor import Stack


@pytest.fixture
def stack(tmp_path, monkeypatch):
    s = Stack(tmp_path, Settings().with_(home=str(tmp_path)))
    monkeypatch.setattr(s, "_running_pid", lambda name, progress: 4242)
    monkeypatch.setattr(s, "read_state", lambda: {"components": {"gateway": {"pid": 4242, "port": 20001,
                                                                             "roles": True}}})
    monkeypatch.setattr(procs, "HEALTH_RETRY_S", 0.0)
    return s


def probe(answers: list):
    asked = []

    def healthz(port: int, timeout: float = 1.0) -> bool:
        asked.append(timeout)
        answer = answers[len(asked) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer
    return healthz, asked


def test_a_running_service_that_is_slow_to_answer_once_is_kept(stack, monkeypatch):
    healthz, asked = probe([TimeoutError("timed out"), True])
    monkeypatch.setattr(stack, "_healthz", healthz)
    said: list[str] = []
    assert stack._service_answers("gateway", said.append) is True
    assert asked == [procs.HEALTH_ANSWER_S] * 2 and "already running" in said[-1]


def test_a_running_service_that_never_says_healthy_is_restarted(stack, monkeypatch):
    healthz, asked = probe([False, TimeoutError("timed out"), False])
    monkeypatch.setattr(stack, "_healthz", healthz)
    said: list[str] = []
    assert stack._service_answers("gateway", said.append) is False
    assert len(asked) == procs.HEALTH_TRIES and "restarting it" in said[-1]
