"""The gateway's image routes against a fake state (no servers): a blueprint's id, one request for
two concurrent asks, 422 naming the field, the build's detail, delete refused while deployed, and a
deploy of an unbuilt image refused with 409 (a built one gets spec.image_ref)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest
from test_gateway_routes import SPEC, FakeBus, FakePool, client, tar_gz  # noqa: F401 - fixtures and fakes
from test_gateway_routes import gw as gw  # noqa: F401 - the fixture

from levers9.contracts import events as E
from levers9.contracts.images import build_steps, image_id
from levers9.contracts.spec import ImageSpec
from levers9.gateway import routes_deployments
from levers9.runtime.bus import Appended, ConcurrencyConflict

BLUEPRINT = {"python_packages": ["humanize==4.9.0"], "commands": ["echo hi > /x"], "env": {"A": "1"}}
IMAGE = image_id(msgspec.convert(BLUEPRINT, ImageSpec))


class ExpectingBus(FakeBus):
    """Appends as NATS does with an expected last subject sequence: the second of two appends that
    expected the same sequence is refused. Each append yields first, as a network round trip does."""

    def __init__(self, gw) -> None:
        super().__init__(gw)
        self.last: dict[str, int] = {}

    async def append(self, env: Any, expected: int) -> Appended:
        await asyncio.sleep(0)
        key = env.subject.rsplit(".", 1)[0]
        if self.last.get(key, 0) != expected:
            raise ConcurrencyConflict(env.subject, expected)
        appended = await self.publish(env)
        self.last[key] = appended.seq
        await self.gw.advanced("builds", appended.seq)
        return appended


@pytest.fixture
def images_gw(gw):  # noqa: F811 - the imported fixture, extended
    gw.bus = ExpectingBus(gw)
    return gw


async def test_two_concurrent_asks_append_one_request(images_gw):
    async with client(images_gw) as c:
        a, b = await asyncio.gather(*[c.post("/api/v1/images", json={"blueprint": BLUEPRINT, "requested_by": "t"})
                                      for _ in range(2)])
    assert sorted([a.status_code, b.status_code]) == [202, 202]
    assert {a.json()["status"], b.json()["status"]} == {"requested", "building"}
    assert {a.json()["image_id"], b.json()["image_id"]} == {IMAGE}
    [ev] = images_gw.bus.events()
    assert isinstance(ev, E.ImageBuildRequested) and ev.image_id == IMAGE and ev.blueprint.env == {"A": "1"}


@pytest.mark.parametrize("body, field", [
    ({"blueprint": {"python_packages": ["--index-url=http://x"]}}, "$.blueprint.python_packages[0]"),
    ({"blueprint": {"apt_packages": ["Bad Name"]}}, "$.blueprint.apt_packages[0]"),
    ({"blueprint": {"env": {"1A": "x"}}}, "$.blueprint.env"),
    ({"blueprint": {"pip": ["x"]}}, "pip"),
    ({}, "blueprint"),
])
async def test_a_bad_blueprint_is_422_naming_the_field(images_gw, body, field):
    async with client(images_gw) as c:
        r = await c.post("/api/v1/images", json=body)
    assert r.status_code == 422 and field in r.json()["detail"], r.text
    assert images_gw.bus.events() == []


def built_row(**over: Any) -> dict[str, Any]:
    archive = {"bucket": "levers9-default", "key": "images/archives/a", "sha256": "a" * 64, "size_bytes": 10,
               "index_key": "images/indexes/i", "index_sha256": "i" * 64}
    steps = msgspec.to_builtins(build_steps(msgspec.convert(BLUEPRINT, ImageSpec)))
    return {"image_id": IMAGE, "status": "built", "reference": f"levers9/images:{IMAGE}", "digest": "sha256:d",
            "size_bytes": 1234, "archive": json.dumps(archive), "last_seq": 9, "steps": json.dumps(steps),
            "step_states": json.dumps({"0": {"state": "cached", "seconds": 0}, "1": {"state": "done", "seconds": 2.5}}),
            "blueprint": json.dumps(BLUEPRINT), "log_tail": json.dumps(["done"]), "reason": "", **over}


async def test_a_built_image_answers_200_and_a_failed_one_is_requested_again(images_gw):
    images_gw.pool.answer("FROM gateway.builds WHERE workspace=$1 AND image_id=$2", [built_row()])
    async with client(images_gw) as c:
        r = await c.post("/api/v1/images", json={"blueprint": BLUEPRINT})
        assert r.status_code == 200 and r.json()["cached"] is True and r.json()["size_bytes"] == 1234
        detail = (await c.get(f"/api/v1/images/{IMAGE}")).json()
        assert [s["state"] for s in detail["steps"]] == ["cached", "done", "waiting"]
        assert detail["steps"][1]["text"] == "RUN pip install humanize==4.9.0"
        images_gw.pool.answer("FROM gateway.builds WHERE workspace=$1 AND image_id=$2",
                              [built_row(status="failed", reason="pip failed")])
        images_gw.bus.last[f"levers9.default.image.{IMAGE}"] = 9
        r = await c.post("/api/v1/images", json={"blueprint": BLUEPRINT})
        assert r.status_code == 202 and r.json()["status"] == "requested"
    [ev] = images_gw.bus.events()
    assert isinstance(ev, E.ImageBuildRequested)


async def test_delete_is_refused_while_a_deployment_uses_the_image(images_gw):
    images_gw.pool.answer("FROM gateway.builds WHERE workspace=$1 AND image_id=$2", [built_row()])
    images_gw.pool.answer("FROM gateway.deployments WHERE workspace=$1 AND status = 'active'", [{"name": "imaged"}])
    async with client(images_gw) as c:
        r = await c.delete(f"/api/v1/images/{IMAGE}")
        assert r.status_code == 409 and "used by deployment(s) imaged" in r.json()["detail"]
        images_gw.pool.answer("FROM gateway.deployments WHERE workspace=$1 AND status = 'active'", [])
        assert (await c.delete(f"/api/v1/images/{IMAGE}")).status_code == 200
    [ev] = images_gw.bus.events()
    assert isinstance(ev, E.ImageDeleted) and ev.image_id == IMAGE


async def test_deploy_needs_the_image_built_and_names_it(images_gw, monkeypatch):
    async def put_code(gw, workspace, data):
        return "ab" * 32, "code/ab.tar.gz"

    monkeypatch.setattr(routes_deployments, "put_code", put_code)
    code = {"code": ("code.tar.gz", tar_gz({"app.py": b"def hello(): ...\n"}), "application/gzip")}
    spec = {**SPEC, "image": BLUEPRINT}
    async with client(images_gw) as c:
        r = await c.post("/api/v1/deployments", data={"spec": json.dumps(spec)}, files=code)
        assert r.status_code == 409, r.text
        assert r.json()["detail"] == (f"image {IMAGE} is not built (status not requested): `levers9 deploy` builds "
                                      f"it first; see `levers9 images logs {IMAGE}`")
        images_gw.pool.answer("FROM gateway.builds WHERE workspace=$1 AND image_id=$2", [built_row()])
        r = await c.post("/api/v1/deployments", data={"spec": json.dumps(spec)}, files=code)
        assert r.status_code == 201, r.text
    [ev] = images_gw.bus.events()
    assert isinstance(ev, E.DeploymentCreated) and ev.spec.image_ref is not None
    assert (ev.spec.image_ref.image_id, ev.spec.image_ref.digest) == (IMAGE, "sha256:d")
    assert ev.spec.image_ref.archive is not None and ev.spec.image_ref.archive.index_key == "images/indexes/i"


def test_a_build_is_over_at_its_end_whatever_progress_comes_after_and_until_it_is_requested_again():
    from hypothesis import given
    from hypothesis import strategies as st

    from levers9.gateway.routes_images import ENDS, build_over

    kinds = st.sampled_from([*ENDS, "ImageBuildRequested", "ImageBuildProgress", "ImageBuildStarted"])

    @given(st.lists(kinds))
    def check(seq):
        over = False
        for kind in seq:
            over = build_over(over, kind)
        marks = [i for i, k in enumerate(seq) if k in ENDS or k == "ImageBuildRequested"]
        assert over == bool(marks and seq[marks[-1]] in ENDS)

    check()
    assert build_over(build_over(False, "ImageBuilt"), "ImageBuildProgress")  # CI: a late progress line
