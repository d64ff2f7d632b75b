"""Notebooks and boxes that keep their memory: what app.notebook sends (JupyterLab under /nb/NAME/, no
token of its own, kernels over Unix sockets, one container, dumped when idle), the mistakes it
refuses with a sentence, the spec rule that idle_checkpoint needs checkpoint_enabled, and the
autoscaler asking for a dump first when it scales such a box in (and only such a box)."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_scheduler_autoscaler import Log, requests

from levers9 import App, ConfigError, Image
from levers9.contracts import events as E
from levers9.contracts.checkpoint_policy import idle_checkpoint
from levers9.contracts.spec import BoxOptions, Code, DeploymentSpec, InvalidSpec, Scaling, decode_spec
from levers9.notebooks import JUPYTERLAB
from levers9.scheduler.autoscaler import Autoscaler
from levers9.scheduler.memory import Memory


def notebook(name: str = "lab", **options) -> dict:
    app = App("notebooks")
    app.notebook(name, **options)
    [spec] = app.specs()
    return spec


def test_a_notebook_is_jupyterlab_under_its_base_url_dumped_when_idle():
    spec = notebook("lab", idle_timeout=120)
    box = spec["box"]
    assert box["command"][:3] == ["python3", "-m", "jupyterlab"]
    assert "--ServerApp.base_url=/nb/lab/" in box["command"] and "--KernelManager.transport=ipc" in box["command"]
    assert "--IdentityProvider.token=" in box["command"]  # the dashboard's session is its only credential
    assert box["ready_path"] == "/nb/lab/api" and box["idle_checkpoint"] is True
    assert spec["checkpoint_enabled"] is True and spec["scaling"]["keep_warm_seconds"] == 120
    assert spec["scaling"]["max_containers"] == 1
    assert JUPYTERLAB in spec["image"]["python_packages"]
    decoded = decode_spec(json.dumps(spec))
    assert decoded.box is not None and decoded.box.idle_checkpoint and idle_checkpoint(decoded)


def test_jupyterlab_is_added_to_the_users_image_once():
    spec = notebook(image=Image(python_packages=["pandas==2.2.3"]))
    assert spec["image"]["python_packages"] == ["pandas==2.2.3", JUPYTERLAB]
    pinned = notebook(image=Image(python_packages=["jupyterlab==4.5.0"]))
    assert pinned["image"]["python_packages"] == ["jupyterlab==4.5.0"]


@pytest.mark.parametrize("name, options, says", [
    ("Lab", {}, "notebook name 'Lab' is not valid"),
    ("lab", {"idle_timeout": 5}, "idle_timeout 5 is not valid"),
    ("lab", {"idle_timeout": True}, "idle_timeout True is not valid"),
    ("lab", {"keep_warm_seconds": 30}, "takes no keep_warm_seconds"),
    ("lab", {"max_containers": 3}, "takes no max_containers"),
    ("lab", {"command": ["sh"]}, "takes no command"),
    ("lab", {"checkpoint_enabled": False}, "checkpoint_enabled=False is refused"),
    ("lab", {"image": "python:3.12"}, "image 'python:3.12' is not valid"),
])
def test_a_notebooks_mistakes_are_refused_with_a_sentence(name, options, says):
    with pytest.raises(ConfigError, match=says):
        notebook(name, **options)


def test_a_box_takes_idle_checkpoint_only_with_checkpoint_enabled():
    app = App("a")
    with pytest.raises(ConfigError, match="idle_checkpoint 'yes' is not valid"):
        app.box("web", command=["srv"], port=80, idle_checkpoint="yes")
    app.box("web", command=["srv"], port=80, idle_checkpoint=True)
    with pytest.raises(InvalidSpec, match="idle_checkpoint"):
        decode_spec(json.dumps(app.specs()[0]))  # checkpoint_enabled was not given
    app.box("kept", command=["srv"], port=80, idle_checkpoint=True, checkpoint_enabled=True)
    assert decode_spec(json.dumps(app.specs()[1])).box.idle_checkpoint  # type: ignore[union-attr]


@given(st.booleans(), st.booleans(), st.sampled_from(["box", "endpoint"]))
def test_only_a_box_with_idle_checkpoint_and_checkpoints_on_is_dumped_before_a_stop(idle, enabled, kind):
    box = BoxOptions(command=["srv"], port=80, idle_checkpoint=idle) if kind == "box" else None
    try:
        spec = DeploymentSpec(name="w", code=Code(kind=kind, module="m", handler="h"), box=box,
                              checkpoint_enabled=enabled)
    except ValueError:
        assert kind == "box" and idle and not enabled  # refused: the rule above
        return
    assert idle_checkpoint(spec) == (kind == "box" and idle and enabled)


def stops_after_idle(box: BoxOptions) -> list[E.ContainerStopRequested]:
    """The ContainerStopRequested the autoscaler appends for a ready box left idle past its window."""
    log, now = Log(), [1_000_000.0]
    a = Autoscaler(log, Memory(), lambda: None, clock=lambda: now[0])  # type: ignore[arg-type]
    a.fleet.sampled("g1", {"gateway": "g1", "deployments": {}}, now[0])
    appended: list[E.Event] = []
    real = a._append

    async def recording(env, ev, expected):
        appended.append(ev)
        return await real(env, ev, expected)

    a._append = recording  # type: ignore[method-assign]
    spec = DeploymentSpec(name="lab", code=Code(kind="box", module="", handler=""), box=box, checkpoint_enabled=True,
                          scaling=Scaling(min_containers=1, scaledown_window=30))
    a.fleet.fold(log.put(E.DeploymentCreated(deployment_id="lab-v1", name="lab", spec=spec)))
    asyncio.run(a.run_pass())
    [c] = requests(a.memory)
    a.memory.apply(log.put(E.ContainerReady(container_id=c.container_id, worker_id="w1", address="http://x")),
                   log.seq)
    a.fleet.ready_at[c.key] = now[0]
    now[0] += 60
    a.fleet.sampled("g1", {"gateway": "g1", "deployments": {}}, now[0])
    a.fleet.fold(log.put(E.DeploymentScaled(deployment_id="lab-v1", min_containers=0)))
    asyncio.run(a.run_pass())
    return [ev for ev in appended if isinstance(ev, E.ContainerStopRequested)]


def test_the_autoscaler_asks_for_a_dump_before_it_scales_in_a_box_that_keeps_its_memory():
    [kept] = stops_after_idle(BoxOptions(command=["srv"], port=80, idle_checkpoint=True))
    assert kept.checkpoint_first and kept.reason.startswith("autoscaler: ")
    [plain] = stops_after_idle(BoxOptions(command=["srv"], port=80))
    assert not plain.checkpoint_first


def test_a_stop_request_from_before_the_field_decodes_as_no_dump():
    import msgspec

    old = msgspec.json.encode({"container_id": "c1", "reason": "idle"})
    assert msgspec.json.decode(old, type=E.ContainerStopRequested).checkpoint_first is False


class Projections:
    """gateway.containers / gateway.checkpoints as the idle-dump wait reads them: answers in turn."""

    def __init__(self, answers: list[int]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def fetchval(self, query: str, *args) -> int:
        self.asked.append(query)
        return self.answers.pop(0) if self.answers else 0


def gateway_with(answers: list[int]):
    from types import SimpleNamespace

    return SimpleNamespace(pool=Projections(answers))


def box_deployment(idle: bool):
    from levers9.gateway.state import Deployment

    spec = DeploymentSpec(name="lab", code=Code(kind="box", module="", handler=""), checkpoint_enabled=True,
                          box=BoxOptions(command=["srv"], port=80, idle_checkpoint=idle))
    return Deployment(workspace="acme", deployment_id="lab-v1", name="lab", version=1, status="active", spec=spec)


def test_a_notebook_waits_for_its_stopping_container_and_its_dump_to_be_stored_before_a_restore():
    from levers9.gateway import idle_dumps

    # stopping (dump under way) -> stopped but its dump not stored -> stored
    gw = gateway_with([1, 0, 1, 0, 0])
    asyncio.run(idle_dumps.settle(gw, box_deployment(idle=True), timeout=30))  # type: ignore[arg-type]
    assert gw.pool.answers == [] and len(gw.pool.asked) == 5
    other = gateway_with([1, 1, 1])
    asyncio.run(idle_dumps.settle(other, box_deployment(idle=False), timeout=30))  # type: ignore[arg-type]
    assert other.pool.asked == []  # any other deployment asks for its container at once


def test_the_wait_for_an_idle_dump_is_bounded():
    from levers9.gateway import idle_dumps

    stuck = gateway_with([1] * 1000)  # a worker that died mid-dump never reports it
    asyncio.run(idle_dumps.settle(stuck, box_deployment(idle=True), timeout=0.3))  # type: ignore[arg-type]
    assert 1 <= len(stuck.pool.asked) < 1000
