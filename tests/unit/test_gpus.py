"""GPU inventory, card assignment and the checkpoint decision of GPU containers (levers9.worker.gpus.cards,
.gpu_checkpoint, .gpu_node), with a configured inventory and a fake NVML (this machine has no GPU)."""

from __future__ import annotations

import json
import re
import sys
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.contracts.spec import decode_spec
from levers9.runtime.config import Settings
from levers9.worker.checkpoints.gpu import NO_DRIVER, driver_major, gpu_checkpoint
from levers9.worker.gpus import cards as gpus
from levers9.worker.gpus import node as gpu_node
from levers9.worker.gpus.cards import (
    CONFIGURED,
    DETECTED,
    Card,
    CardLedger,
    CardsRefused,
    Detected,
    choose_cards,
    choose_inventory,
    gpu_type_of,
)


@pytest.mark.parametrize("name, kind", [
    ("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("Tesla T4", "T4"), ("Tesla V100-SXM2-16GB", "V100"),
    ("NVIDIA GeForce RTX 4090", "RTX4090"), ("NVIDIA RTX A6000", "RTXA6000"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA A10G", "A10G"), ("NVIDIA GH200 480GB", "GH200"), ("H100", "H100"), ("h100", "H100"),
    ("A100-80GB", "A100"), ("RTX-4090", "RTX4090"), ("NVIDIA", ""), ("", ""),
])
def test_nvml_names_and_pool_types_map_alike(name, kind):
    assert gpu_type_of(name) == kind


@given(st.text(max_size=60))
def test_a_mapped_type_is_a_valid_gpu_type_or_empty(name):
    kind = gpu_type_of(name)
    assert kind == "" or re.fullmatch(r"[A-Z0-9][A-Z0-9_.-]{0,31}", kind)  # what a spec accepts as a GPU type
    assert gpu_type_of(kind) == kind  # a type maps to itself


H200 = [Card(i, f"GPU-{i:04d}", "NVIDIA H200", 143771) for i in range(4)]


def test_detected_cards_of_the_pool_type_are_offered():
    inv = choose_inventory(Detected(tuple(H200[:2]), "580.65.06"), "H200", 0)
    assert (inv.source, inv.gpu_type, inv.driver, inv.note) == (DETECTED, "H200", "580.65.06", "")
    assert inv.registration() == {"gpu_type": "H200", "gpu_count": 2, "gpu_source": DETECTED,
                                  "gpu_ids": ["GPU-0000", "GPU-0001"], "gpu_driver": "580.65.06"}


def test_a_card_of_another_type_is_left_out_and_said():
    mixed = (H200[0], Card(1, "GPU-x", "NVIDIA A100-SXM4-80GB"), H200[2])
    inv = choose_inventory(Detected(mixed, "580.65.06"), "H200", 3)
    assert [c.index for c in inv.cards] == [0, 2]
    assert "1: NVIDIA A100-SXM4-80GB (A100)" in inv.note and "not of the pool's type H200" in inv.note
    assert "gpus_per_worker=3 but 2 card(s)" in inv.note
    none_match = choose_inventory(Detected(tuple(H200), "580.65.06"), "H100", 2)
    assert none_match.cards == () and none_match.registration()["gpu_count"] == 0
    assert "4 card(s) not of the pool's type H100" in none_match.note


def test_without_a_pool_type_the_detected_type_is_taken():
    inv = choose_inventory(Detected(tuple(H200[:1]), "570.1"), "", 0)
    assert (inv.gpu_type, len(inv.cards)) == ("H200", 1)


def test_without_nvml_the_configuration_is_taken_and_marked_configured():
    inv = choose_inventory(None, "H100", 2)
    assert inv.registration() == {"gpu_type": "H100", "gpu_count": 2, "gpu_source": CONFIGURED,
                                  "gpu_ids": ["0", "1"], "gpu_driver": ""}
    assert choose_inventory(Detected((), ""), "H100", 1).source == CONFIGURED  # NVML there, no card
    assert choose_inventory(None, "", 0).registration()["gpu_count"] == 0
    assert "without a gpu_type" in choose_inventory(None, "", 2).note
    assert "no card was detected" in choose_inventory(None, "H100", 0).note


def test_read_nvml_without_a_driver_is_none():
    assert gpus.read_nvml() is None  # nvidia-ml-py is installed; libnvidia-ml is not (no driver here)


def test_read_nvml_reads_every_card(monkeypatch):
    class NVMLError(Exception):
        pass
    fake = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "580.65.06", nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetUUID=lambda h: f"GPU-{h}".encode(),
        nvmlDeviceGetName=lambda h: "NVIDIA H200", nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=2 << 30))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpus.read_nvml() == Detected((Card(0, "GPU-0", "NVIDIA H200", 2048), Card(1, "GPU-1", "NVIDIA H200", 2048)),
                                        "580.65.06")

    def broken() -> None:
        raise NVMLError("Driver Not Loaded")
    monkeypatch.setattr(fake, "nvmlInit", broken)
    assert gpus.read_nvml() is None


# ---- cards ---------------------------------------------------------------------------------------

@given(st.integers(1, 16), st.lists(st.integers(0, 9), max_size=12))
def test_cards_are_never_given_twice_and_the_count_is_exact(n_cards, asks):
    ledger = CardLedger(tuple(str(i) for i in range(n_cards)))
    for i, count in enumerate(asks):
        free_before = n_cards - sum(len(v) for v in ledger.taken.values())
        if 0 < count <= min(free_before, gpus.MAX_CARDS_PER_CONTAINER):
            chosen = ledger.take(f"c{i}", count)
            assert len(chosen) == count
        elif count == 0:
            assert ledger.take(f"c{i}", 0) == () and f"c{i}" not in ledger.taken
        else:
            with pytest.raises(CardsRefused):
                ledger.take(f"c{i}", count)
            assert f"c{i}" not in ledger.taken
        held = [card for owned in ledger.taken.values() for card in owned]
        assert len(held) == len(set(held)) and set(held) <= set(ledger.cards)
        if i % 3 == 2 and ledger.taken:  # containers stop now and then: their cards come back
            ledger.free(next(iter(ledger.taken)))


def test_choose_cards_takes_the_lowest_free_and_says_why_not():
    assert choose_cards(["0", "1", "2", "3"], {"a": ("0", "2")}, 2) == ("1", "3")
    with pytest.raises(CardsRefused, match=r"3 GPU\(s\) asked, 2 of this node's 4 free"):
        choose_cards(["0", "1", "2", "3"], {"a": ("0", "2")}, 3)
    with pytest.raises(CardsRefused, match="at most 8"):
        choose_cards([str(i) for i in range(16)], {}, 9)


def test_a_freed_container_gives_its_cards_back_and_a_restart_keeps_them():
    ledger = CardLedger(("0", "1"))
    assert ledger.take("a", 2) == ("0", "1") and ledger.take("a", 2) == ("0", "1")
    with pytest.raises(CardsRefused):
        ledger.take("b", 1)
    ledger.free("a")
    assert ledger.take("b", 1) == ("0",)


# ---- checkpoints of GPU containers ---------------------------------------------------------------

@pytest.mark.parametrize("driver, ckpt, plugin, allowed, words", [
    ("", True, True, False, NO_DRIVER),
    ("550.54.15", True, True, False, "older than 570"),
    ("570.86.10", False, True, False, "no cuda-checkpoint"),
    ("580.65.06", True, False, False, "CUDA plugin"),
    ("580.65.06", True, True, True, "present"),
    ("570", True, True, True, "present"),
    ("beta", True, True, False, "not understood"),
])
def test_gpu_checkpoint_decision(driver, ckpt, plugin, allowed, words):
    ok, why = gpu_checkpoint(driver, ckpt, plugin)
    assert ok is allowed and words in why


@given(st.integers(0, 999), st.booleans(), st.booleans())
def test_gpu_checkpoint_needs_all_three(major, ckpt, plugin):
    ok, why = gpu_checkpoint(f"{major}.10.2", ckpt, plugin)
    assert ok == (major >= 570 and ckpt and plugin) and why
    assert driver_major(f"{major}.10.2") == major


# ---- the worker's node shell, configured inventory -----------------------------------------------

def spec(gpu_count: int, checkpoint: bool = True):
    return decode_spec(json.dumps({"name": "g", "code": {"module": "m", "handler": "h"}, "checkpoint_enabled": checkpoint,
                        "resources": {"gpu": ["H100"], "gpu_count": gpu_count} if gpu_count else {}}))


async def test_node_gpus_with_a_configured_inventory(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_node, "read_nvml", lambda: None)
    node = gpu_node.NodeGpus(Settings().with_(worker_gpu_type="H100", worker_gpu_count=2, image_cache=str(tmp_path)), tmp_path)
    assert await node.register() == {"gpu_type": "H100", "gpu_count": 2, "gpu_source": CONFIGURED,
                                     "gpu_ids": ["0", "1"], "gpu_driver": ""}
    a, b = node.take("a", spec(1)), node.take("b", spec(1))
    assert a["gpu"].env == {"NVIDIA_VISIBLE_DEVICES": "0"} and b["gpu"].env == {"NVIDIA_VISIBLE_DEVICES": "1"}
    assert a["gpu"].cdi_spec is None and "NVIDIA_VISIBLE_DEVICES only" in a["gpu"].note
    with pytest.raises(CardsRefused):
        node.take("c", spec(1))
    node.free("a")
    assert node.take("c", spec(1))["gpu"].devices == ("0",)
    assert node.take("plain", spec(0)) == {}
    assert node.checkpoint_refusal(spec(1)) == f"GPU checkpoints off: {NO_DRIVER}"
    assert node.cold_note(spec(1)) == f"cold, no checkpoint: GPU checkpoints off: {NO_DRIVER}"
    assert node.cold_note(spec(1, checkpoint=False)) == "" and node.checkpoint_refusal(spec(0)) == ""
    assert node.health()["source"] == CONFIGURED and node.health()["taken"] == {"b": ("1",), "c": ("0",)}
