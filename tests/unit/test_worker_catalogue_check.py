"""A worker's announcement of the shared checkpoints it can restore (pure part)."""

from __future__ import annotations

from levers9.contracts.catalogue import Catalogue, SandboxSettings, SharedCheckpoint
from levers9.worker.sandboxes.catalogue_check import check, cpu_features

MINE = SandboxSettings(network_mode="bridge", overlay=True, lazy_image=True, cpu_features=["avx", "avx2"],
                       python="3.11")


def catalogue(*checkpoints: SharedCheckpoint) -> Catalogue:
    return Catalogue(catalogue_id="c1", checkpoints=list(checkpoints))


def ck(cid: str, generation: int = 1, **settings: object) -> SharedCheckpoint:
    base = {"network_mode": "bridge", "overlay": True, "lazy_image": True, "cpu_features": ["avx"], "python": "3.11"}
    return SharedCheckpoint(checkpoint_id=cid, image_id="im", packages=[], executor_generation=generation,
                            settings=SandboxSettings(**{**base, **settings}))  # type: ignore[arg-type]


def test_a_checkpoint_captured_with_other_settings_is_dropped_with_why():
    restorable, dropped = check(catalogue(ck("ok"), ck("avx512", cpu_features=["avx512f"]), ck("py", python="3.12")),
                                MINE, "drop", can_restore=True)
    assert restorable == ["ok"]
    assert "avx512f" in dropped["avx512"] and "3.12" in dropped["py"]


def test_keep_announces_them_anyway_but_never_another_executor_generation():
    restorable, dropped = check(catalogue(ck("py", python="3.12"), ck("gen", generation=9)), MINE, "keep", True)
    assert restorable == ["py"] and "generation 9" in dropped["gen"]


def test_a_worker_without_criu_or_with_them_off_announces_none():
    assert check(catalogue(ck("ok")), MINE, "drop", can_restore=False)[0] == []
    restorable, dropped = check(catalogue(ck("ok")), MINE, "off", can_restore=True)
    assert restorable == [] and "off" in dropped["ok"]


def test_cpu_features_are_read_from_cpuinfo():
    assert cpu_features("processor: 0\nflags\t\t: fpu sse4_2 avx avx2 xsave\n") == ["avx", "avx2", "sse4_2"]
    assert cpu_features("") == []
