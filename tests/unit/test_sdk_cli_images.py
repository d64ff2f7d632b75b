"""The CLI's image builds without a gateway: events folded into the step lines it shows, each
distinct blueprint asked for once, a built one used at once, a failed one ending the deploy with
its step, reason and log tail."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from levers9 import Image
from levers9.cli_images import BuildFailed, BuildView, distinct_blueprints, ensure_images, log_lines
from levers9.contracts.images import build_steps
from levers9.contracts.spec import ImageSpec

IMG = Image(python_packages=["humanize==4.9.0"]).add_commands("echo a > /a", "echo b > /b")
STEPS = msgspec.to_builtins(build_steps(msgspec.convert(IMG.to_dict(), ImageSpec)))


def ev(kind: str, **data: Any) -> dict[str, Any]:
    return {"type": kind, "data": {"image_id": IMG.id, **data}}


def started(cached: int = 1) -> dict[str, Any]:
    return ev("ImageBuildStarted", builder="w-build-1", steps=STEPS, cached_steps=cached, blueprint=IMG.to_dict())


def test_steps_show_cached_running_done_with_seconds_and_the_last_log_line():
    view = BuildView(IMG.id)
    for e in [ev("ImageBuildRequested"), started(cached=1),
              ev("ImageBuildProgress", step=1, total=4, state="done", seconds=3.14),
              ev("ImageBuildProgress", step=2, total=4, state="running"),
              ev("ImageBuildProgress", step=2, total=4, state="log", lines=["a", "Successfully installed x"])]:
        view.apply(e)
    assert view.lines() == [
        f"[1/4] FROM {STEPS[0]['args'][0]} ... cached",
        "[2/4] RUN pip install humanize==4.9.0 ... done 3.1 s",
        "[3/4] RUN echo a > /a ... running",
        "[4/4] RUN echo b > /b ... waiting",
        "  Successfully installed x"]


def test_a_failure_names_the_step_and_a_new_request_starts_over():
    view = BuildView(IMG.id)
    for e in [started(), ev("ImageBuildFailed", reason="pip exited 1", step=1, log_tail=["ERROR: No matching"])]:
        view.apply(e)
    assert view.failure() == (f"image {IMG.id} failed to build at step 2/4 (RUN pip install humanize==4.9.0): "
                              "pip exited 1")
    assert view.log_tail == ["ERROR: No matching"] and "failed" in view.lines()[1]
    view.apply(ev("ImageBuildRequested"))
    assert (view.status, view.steps, view.reason) == ("requested", [], "")


def test_logs_print_state_changes_and_output_once():
    view = BuildView(IMG.id)
    assert log_lines(view, started())[0] == "started on w-build-1"
    assert log_lines(view, ev("ImageBuildProgress", step=1, total=4, state="running")) == [
        "[2/4] RUN pip install humanize==4.9.0 ... running"]
    assert log_lines(view, ev("ImageBuildProgress", step=1, total=4, state="log", lines=["x", "y"])) == ["x", "y"]


class FakeClient:
    def __init__(self, answers: dict[str, str], events: dict[str, list[dict[str, Any]]]) -> None:
        self.answers, self.events, self.asked = answers, events, []

    def request_image(self, blueprint: dict[str, Any], requested_by: str = "") -> dict[str, Any]:
        image = Image(**{k: v for k, v in blueprint.items()}).id
        self.asked.append((image, requested_by))
        return {"image_id": image, "status": self.answers.get(image, "requested")}

    def image_events(self, image_id: str, follow: bool = False):
        yield from self.events.get(image_id, [])


def specs(*images: Image | None) -> list[dict[str, Any]]:
    return [{"name": f"ep{i}", **({"image": img.to_dict()} if img else {})} for i, img in enumerate(images)]


def test_identical_blueprints_are_asked_for_once_and_a_built_one_is_used_at_once(capsys):
    other = Image(python_packages=["six"])
    c = FakeClient({IMG.id: "built"}, {other.id: [started(), ev("ImageBuilt", size_bytes=2 << 20, seconds=4.0)]})
    assert set(distinct_blueprints(specs(IMG, IMG, None, other))) == {IMG.id, other.id}
    names = ensure_images(c, specs(IMG, IMG, None, other))  # type: ignore[arg-type]
    assert names == {"ep0": IMG.id, "ep1": IMG.id, "ep3": other.id}
    assert c.asked == [(IMG.id, "ep0,ep1"), (other.id, "ep3")]
    err = capsys.readouterr().err
    assert f"using cached image {IMG.id}" in err and f"built image {other.id} (2.0 MiB) in 4.0 s" in err


def test_a_failed_build_stops_the_deploy_with_its_step_reason_and_log_tail(capsys):
    c = FakeClient({}, {IMG.id: [started(), ev("ImageBuildFailed", reason="pip exited 1", step=1,
                                                 log_tail=["ERROR: No matching distribution"])]})
    with pytest.raises(BuildFailed, match=r"at step 2/4 .* pip exited 1: see `levers9 images logs im-"):
        ensure_images(c, specs(IMG))  # type: ignore[arg-type]
    assert "ERROR: No matching distribution" in capsys.readouterr().err
