"""The image-builder's pure decisions: which build-pool worker takes a build, what the layer cache
spares, when a lost builder's build is given again or failed, when waiting turns into failing; the
OCI layer unpacking (whiteouts, links left by lower layers) and the builds view's fold."""

from __future__ import annotations

import datetime as dt
import io
import json
import tarfile
from pathlib import Path

import pytest
from contracts_strategies import images
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts import events as E
from levers9.contracts.images import build_steps, cached_prefix
from levers9.contracts.spec import ImageSpec
from levers9.image_builder import oci
from levers9.image_builder.decide import (
    BUILD_POOL,
    MAX_ATTEMPTS,
    WAIT_FOR_BUILDER_S,
    Build,
    Fail,
    Start,
    Wait,
    Worker,
    choose_builder,
    plan,
)
from levers9.runtime.views import fold_build

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
workers_st = st.lists(st.builds(Worker, worker_id=st.sampled_from([f"w{i}" for i in range(6)]),
                                pool=st.sampled_from([BUILD_POOL, "default"]),
                                status=st.sampled_from(["ready", "registered", "lost"]), cordoned=st.booleans(),
                                cpu_millicores=st.integers(0, 8000)), max_size=8,
                      unique_by=lambda w: w.worker_id)


def build(image_id="im-1", status="requested", builder="", attempt=0, ago=1.0, blueprint=ImageSpec()):
    at = NOW - dt.timedelta(seconds=ago)
    return Build("ws", image_id, status, blueprint, last_seq=7, builder=builder, attempt=attempt, requested_at=at,
                 started_at=at if builder else None)


@given(workers_st, st.sets(st.sampled_from([f"w{i}" for i in range(6)])))
def test_a_builder_is_a_ready_uncordoned_idle_build_worker_with_most_cpu(workers, busy):
    chosen = choose_builder(workers, busy)
    fit = [w for w in workers if w.pool == BUILD_POOL and w.status == "ready" and not w.cordoned
           and w.worker_id not in busy]
    if not fit:
        assert chosen is None
    else:
        w = next(w for w in fit if w.worker_id == chosen)
        assert w.cpu_millicores == max(x.cpu_millicores for x in fit)


@given(workers_st, st.lists(st.sampled_from(["im-a", "im-b", "im-c", "im-d"]), unique=True))
def test_each_worker_takes_one_build_per_pass(workers, ids):
    decisions = plan([build(i) for i in ids], workers, set(), NOW)
    starts = [d for d in decisions if isinstance(d, Start)]
    assert len({d.builder for d in starts}) == len(starts)
    free = {w.worker_id for w in workers if w.pool == BUILD_POOL and w.status == "ready" and not w.cordoned}
    assert len(starts) == min(len(ids), len(free))
    assert all(isinstance(d, (Start, Wait)) for d in decisions)  # nobody waited past the bound


@given(images, st.data())
def test_a_start_resumes_after_the_cached_prefix(blueprint, data):
    steps = build_steps(blueprint)
    cached = set(data.draw(st.lists(st.sampled_from([s.hash for s in steps]))))
    [d] = plan([build(blueprint=blueprint)], [Worker("b1", BUILD_POOL, "ready")], cached, NOW)
    assert isinstance(d, Start) and d.steps == steps and d.attempt == 1
    assert d.cached_steps == cached_prefix(steps, cached)
    assert all(s.hash in cached for s in steps[:d.cached_steps])
    assert d.cached_steps == len(steps) or steps[d.cached_steps].hash not in cached


def test_no_builder_waits_saying_so_then_fails_after_the_bound():
    [d] = plan([build()], [Worker("w", "default", "ready")], set(), NOW)
    assert isinstance(d, Wait) and "pool 'build'" in d.message
    assert plan([build()], [], set(), NOW, {"im-1": NOW}) == []  # said a moment ago
    [d] = plan([build(ago=WAIT_FOR_BUILDER_S + 1)], [Worker("b", BUILD_POOL, "registered")], set(), NOW)
    assert isinstance(d, Fail) and "could take the build within 600 s" in d.reason and "none ready" in d.reason


def test_a_lost_builders_build_goes_to_another_or_fails_after_max_attempts():
    workers = [Worker("b1", BUILD_POOL, "lost"), Worker("b2", BUILD_POOL, "ready")]
    [d] = plan([build(status="building", builder="b1", attempt=1)], workers, set(), NOW)
    assert isinstance(d, Start) and (d.builder, d.attempt) == ("b2", 2)
    [d] = plan([build(status="building", builder="b1", attempt=MAX_ATTEMPTS)], workers, set(), NOW)
    assert isinstance(d, Fail) and "was lost" in d.reason
    # a live builder keeps its build, and is busy for the others
    workers = [Worker("b1", BUILD_POOL, "ready")]
    assert [type(d) for d in plan([build("im-x", "building", "b1", 1), build("im-y")], workers, set(), NOW)] == [Wait]


def layer(entries: list[tuple[str, str, str]]) -> bytes:
    """A gzip tar of (name, kind f|d|l|h, content or link target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, value in entries:
            info = tarfile.TarInfo(name)
            if kind == "f":
                info.size = len(value.encode())
                tar.addfile(info, io.BytesIO(value.encode()))
                continue
            info.type = {"d": tarfile.DIRTYPE, "l": tarfile.SYMTYPE, "h": tarfile.LNKTYPE}[kind]
            info.linkname = value
            tar.addfile(info)
    return buf.getvalue()


def layout(tmp: Path, layers: list[bytes]) -> Path:
    import hashlib

    out = tmp / "layout"
    (out / "blobs" / "sha256").mkdir(parents=True)

    def blob(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (out / "blobs" / "sha256" / digest).write_bytes(data)
        return f"sha256:{digest}"

    manifest = {"schemaVersion": 2, "layers": [{"digest": blob(d), "size": len(d)} for d in layers]}
    (out / "index.json").write_text(json.dumps({"manifests": [{"digest": blob(json.dumps(manifest).encode()),
                                                               "annotations": {"org.opencontainers.image.ref.name": "img"}}]}))
    return out


def test_layers_apply_in_order_with_whiteouts(tmp_path):
    base = layer([("etc", "d", ""), ("etc/a", "f", "a"), ("etc/b", "f", "b"), ("opt", "d", ""), ("opt/x", "f", "x"),
                  ("link", "l", "/etc"), ("hard", "h", "etc/a")])
    top = layer([("etc/.wh.a", "f", ""), ("opt/.wh..wh..opq", "f", ""), ("opt/y", "f", "y"), ("link", "f", "file")])
    root = tmp_path / "root"
    assert oci.unpack(layout(tmp_path, [base, top]), root) == 2
    assert sorted(p.name for p in (root / "etc").iterdir()) == ["b"]
    assert sorted(p.name for p in (root / "opt").iterdir()) == ["y"]  # opaque: lower x hidden, own y kept
    assert (root / "link").read_text() == "file" and not (root / "link").is_symlink()  # replaced, not followed
    assert (root / "hard").read_text() == "a"
    assert oci.tree_bytes(root) == len("b" + "y" + "file" + "a")


@pytest.mark.parametrize("evil", [[("../x", "f", "x")], [("esc", "l", "/tmp"), ("esc/x", "f", "x")]])
def test_a_layer_cannot_write_outside_the_root(tmp_path, evil):
    with pytest.raises(oci.PullFailed, match="climbs out|outside the root"):
        oci.unpack(layout(tmp_path, [layer(evil)]), tmp_path / "root")


def test_the_builds_view_folds_a_build():
    spec = ImageSpec(python_packages=["six"], commands=["echo a"])
    steps = build_steps(spec)
    row: dict = {}
    for ev in [E.ImageBuildRequested(image_id="im-1", blueprint=spec, requested_by="x"),
               E.ImageBuildStarted(image_id="im-1", builder="b", blueprint=spec, steps=steps, cached_steps=1),
               E.ImageBuildProgress(image_id="im-1", step=1, total=3, state="running"),
               E.ImageBuildProgress(image_id="im-1", step=1, total=3, state="log", lines=["Collecting six"]),
               E.ImageBuildFailed(image_id="im-1", reason="pip failed", step=1, log_tail=["ERROR: no six"])]:
        row = fold_build(row, ev, NOW)
    assert row["status"] == "failed" and row["failing_step"] == 1 and row["log_tail"] == ["ERROR: no six"]
    assert row["step_states"]["0"]["state"] == "cached" and row["step_states"]["1"]["state"] == "failed"
    assert row["step_states"]["2"]["state"] == "waiting"
    row = fold_build(row, E.ImageBuildRequested(image_id="im-1", blueprint=spec), NOW)
    assert (row["status"], row["reason"], row["failing_step"], row["log_tail"]) == ("requested", "", -1, [])
