"""The scheduler as the router of function sandboxes: shared pre-import checkpoints in decide()."""

from __future__ import annotations

import json

from levers9.contracts import events as E
from levers9.contracts.catalogue import Catalogue, PackageTiming, SandboxSettings, SharedCheckpoint
from levers9.contracts.spec import CheckpointRef, ImageRef, Resources, decode_spec
from levers9.scheduler.decision import decide
from levers9.scheduler.placement import WorkerState

SCI = [PackageTiming(distribution="numpy", modules=["numpy"], import_seconds=0.15, rss_mib=20),
       PackageTiming(distribution="pandas", modules=["pandas"], import_seconds=0.6, rss_mib=40,
                     depends_on=["numpy"]),
       PackageTiming(distribution="scikit-learn", modules=["sklearn"], import_seconds=1.1, rss_mib=60,
                     depends_on=["numpy", "scipy"]),
       PackageTiming(distribution="scipy", modules=["scipy"], import_seconds=0.3, rss_mib=20, depends_on=["numpy"])]
CATALOGUE = Catalogue(
    catalogue_id="cat1", image_id="im-cat", image=ImageRef(image_id="im-cat"), packages=SCI,
    checkpoints=[SharedCheckpoint(checkpoint_id="ck-sci", image_id="im-cat", packages=SCI, restore_seconds=0.2,
                                  settings=SandboxSettings(python="3.11"),
                                  ref=CheckpointRef(checkpoint_id="ck-sci", bucket="b", key="k"))])


def worker(wid: str, restorable: frozenset[str] = frozenset({"ck-sci"}), criu: bool = True) -> WorkerState:
    return WorkerState(worker_id=wid, pool="default", status="ready", cpu_millicores=4000, memory_mib=8192,
                       features=frozenset({"runc", *(["criu"] if criu else [])}), restorable=restorable)


def request(imports: list[str], **function: object) -> E.ContainerRequested:
    spec = decode_spec(json.dumps({"name": "fn-x", "code": {"kind": "function", "module": "", "handler": ""},
                                   "function": function}))
    return E.ContainerRequested(container_id="c1", deployment_id="fn-x-v1", resources=Resources(memory_mib=512),
                                spec=spec, imports=imports)


def test_a_call_importing_the_checkpoints_packages_restores_it_on_the_catalogue_image():
    d = decide(request(["sklearn", "pandas", "os"]), [worker("w1")], {"cpu": CATALOGUE})
    assert d.worker_id == "w1" and d.checkpoint is not None and d.checkpoint.checkpoint_id == "ck-sci"
    assert d.image is not None and d.image.image_id == "im-cat" and "criu" in d.request.features
    assert d.choice["chosen"]["candidate"] == "shared:ck-sci" and d.choice["runner_up"]["candidate"] == "cold"
    assert d.choice["chosen"]["seconds"] < d.choice["runner_up"]["seconds"]
    assert d.note.startswith("shared checkpoint ck-sci: estimated")


def test_no_shared_checkpoint_when_the_function_opts_out_or_no_worker_can_restore():
    off = decide(request(["sklearn"], shared_checkpoints=False), [worker("w1")], {"cpu": CATALOGUE})
    assert off.checkpoint is None and off.choice == {}
    none = decide(request(["sklearn"]), [worker("w1", restorable=frozenset())], {"cpu": CATALOGUE})
    assert none.checkpoint is None and none.choice["chosen"]["candidate"] == "cold"
    no_criu = decide(request(["sklearn"]), [worker("w1", criu=False)], {"cpu": CATALOGUE})
    assert no_criu.checkpoint is None


def test_the_worker_that_announced_the_checkpoint_gets_the_restore():
    d = decide(request(["sklearn"]), [worker("w1", restorable=frozenset()), worker("w2")], {"cpu": CATALOGUE})
    assert d.worker_id == "w2" and d.checkpoint is not None


def test_without_a_catalogue_or_imports_the_usual_decision_applies():
    assert decide(request(["sklearn"]), [worker("w1")], {}).choice == {}
    assert decide(request([]), [worker("w1")], {"cpu": CATALOGUE}).choice == {}
