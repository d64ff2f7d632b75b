"""CDI edits applied to a runc config.json (levers9.worker.gpus.cdi): a spec shaped like what
`nvidia-ctk cdi generate --format json` writes, devices named by index and by uuid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from levers9.worker.gpus import cdi
from levers9.worker.gpus.cards import GpuGrant
from levers9.worker.runtime.interface import ContainerSpec
from levers9.worker.runtime.runc.bundle import bundle_spec, container_env, upper_files

UUID0, UUID1 = "GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"


def device(name: str, index: int) -> dict:
    return {"name": name, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{index}"}]}}


SPEC = {
    "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
    "devices": [device("0", 0), device(UUID0, 0), device("1", 1), device(UUID1, 1),
                {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidia1"}]}}],
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"},
                        {"path": "/dev/nvidia-uvm-tools", "type": "c", "major": 507, "minor": 1}],
        "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk",
                   "args": ["nvidia-ctk", "hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]}],
        "mounts": [{"hostPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
                    "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06",
                    "options": ["ro", "nosuid", "nodev", "bind"]},
                   {"hostPath": "/run/nvidia-persistenced/socket", "containerPath": "/run/nvidia-persistenced/socket"}],
    },
}
MAJORS = {"/dev/nvidia0": 0, "/dev/nvidia1": 1, "/dev/nvidiactl": 255, "/dev/nvidia-uvm": 0}


def fake_stat(path: str) -> tuple[str, int, int]:
    """The host's device nodes as a GPU node has them (no /dev/nvidia* here)."""
    return ("c", 510 if path == "/dev/nvidia-uvm" else 195, MAJORS[path])


def base_config() -> dict:
    return {"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"], "user": {"uid": 0, "gid": 0}},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}}}


def test_the_chosen_devices_and_the_common_edits_are_applied():
    config = base_config()
    out = cdi.apply_cdi(config, SPEC, ["1"], stat_device=fake_stat)
    assert config == base_config()  # the input is not changed
    paths = [d["path"] for d in out["linux"]["devices"]]
    assert paths == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1"]
    assert "/dev/nvidia0" not in paths  # a card not given is not there
    assert {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1} in out["linux"]["devices"]
    assert {"path": "/dev/nvidia-uvm-tools", "type": "c", "major": 507, "minor": 1} in out["linux"]["devices"]
    rules = out["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}  # deny all stays first; each node allowed after it
    assert {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rwm"} in rules
    assert not any(r.get("minor") == 0 and r.get("major") == 195 for r in rules)
    assert out["process"]["env"] == ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"]  # replaced, not duplicated
    assert out["hooks"]["createContainer"][0]["args"][:3] == ["nvidia-ctk", "hook", "update-ldcache"]
    libcuda = next(m for m in out["mounts"] if m["destination"].endswith("libcuda.so.580.65.06"))
    assert libcuda == {"destination": libcuda["source"], "source": libcuda["source"], "type": "bind",
                       "options": ["ro", "nosuid", "nodev", "bind"]}
    assert any(m["destination"] == "/run/nvidia-persistenced/socket" and "bind" in m["options"] for m in out["mounts"])


def test_two_devices_by_uuid_and_gids():
    spec = {**SPEC, "containerEdits": {**SPEC["containerEdits"], "additionalGIDs": [44]}}
    out = cdi.apply_cdi(base_config(), spec, [UUID0, UUID1], stat_device=fake_stat)
    nodes = [d["path"] for d in out["linux"]["devices"]]
    assert nodes[-2:] == ["/dev/nvidia0", "/dev/nvidia1"] and len(nodes) == len(set(nodes))
    assert out["process"]["user"]["additionalGids"] == [44]


def test_unknown_devices_and_hooks_are_refused():
    with pytest.raises(cdi.CdiError, match="no device"):
        cdi.apply_cdi(base_config(), SPEC, ["7"], stat_device=fake_stat)
    bad = {**SPEC, "containerEdits": {"hooks": [{"hookName": "beforeEverything", "path": "/x"}]}}
    with pytest.raises(cdi.CdiError, match="hookName"):
        cdi.apply_cdi(base_config(), bad, ["0"], stat_device=fake_stat)


def test_device_names_prefer_the_uuid_and_fall_back_to_the_index():
    assert cdi.cdi_device_names(SPEC, [(0, UUID0), (1, "")]) == [UUID0, "1"]
    by_index = {**SPEC, "devices": [device("0", 0), device("1", 1)]}
    assert cdi.cdi_device_names(by_index, [(1, UUID1)]) == ["1"]
    with pytest.raises(cdi.CdiError):
        cdi.cdi_device_names(by_index, [(5, "GPU-x")])


def test_merge_env_replaces_and_appends():
    assert cdi.merge_env(["A=1", "B=2"], ["B=3", "C=4", "A=5"]) == ["A=5", "B=3", "C=4"]


def test_generate_without_nvidia_ctk_says_env_only(monkeypatch, tmp_path):
    monkeypatch.setattr(cdi, "nvidia_ctk", lambda: None)
    spec, note = cdi.generate(tmp_path / "nvidia.json")
    assert spec is None and "nvidia-ctk not found" in note and "NVIDIA_VISIBLE_DEVICES only" in note


def test_generate_runs_nvidia_ctk_and_reads_its_json(monkeypatch, tmp_path):
    """A stand-in nvidia-ctk (a script) that writes the fixture spec where --output says."""
    ctk = tmp_path / "nvidia-ctk"
    ctk.write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = --output ] && out=$2; shift; done\n"
                   f"cat > \"$out\" <<'EOS'\n{json.dumps(SPEC)}\nEOS\n")
    ctk.chmod(0o755)
    monkeypatch.setattr(cdi, "nvidia_ctk", lambda: str(ctk))
    spec, note = cdi.generate(tmp_path / "cdi" / "nvidia.json")
    assert spec == SPEC and "5 devices" in note


def cspec(tmp_path: Path, grant: GpuGrant | None) -> ContainerSpec:
    return ContainerSpec(container_id="c1", code_dir=tmp_path, sdk_dir=tmp_path, env={"A": "1"},
                         cpu_millicores=500, memory_mib=256, gpu=grant)


def test_bundle_applies_the_grant(tmp_path, monkeypatch):
    monkeypatch.setattr(cdi, "host_device", fake_stat)
    grant = GpuGrant((UUID1,), SPEC, (UUID1,), "levers9: GPUs ... CDI edits applied")
    config = bundle_spec(cspec(tmp_path, grant), tmp_path / "root", tmp_path / "netns")
    assert f"NVIDIA_VISIBLE_DEVICES={UUID1}" in config["process"]["env"]  # ours, not the spec's void
    assert "/dev/nvidia1" in [d["path"] for d in config["linux"]["devices"]]
    assert upper_files(cspec(tmp_path, grant), "10.0.0.2")["/var/log/levers9/container.log"].startswith("levers9: GPUs")


def test_bundle_without_cdi_sets_the_env_only(tmp_path):
    env_only = GpuGrant(("0", "1"), note="levers9: GPUs 0,1 (H100, configured); NVIDIA_VISIBLE_DEVICES only")
    config = bundle_spec(cspec(tmp_path, env_only), tmp_path / "root", tmp_path / "netns")
    assert "NVIDIA_VISIBLE_DEVICES=0,1" in config["process"]["env"]
    assert "devices" not in config["linux"] and "hooks" not in config
    assert not any(e.startswith("NVIDIA_VISIBLE_DEVICES") for e in container_env(cspec(tmp_path, None)))
    assert upper_files(cspec(tmp_path, None), "10.0.0.2")["/var/log/levers9/container.log"] == ""


def test_the_process_runtime_gives_the_cards_too(tmp_path):
    from levers9.worker.runtime.process import process_env

    env = process_env(cspec(tmp_path, GpuGrant(("0", "1"))), 8000)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "0,1"
    assert "NVIDIA_VISIBLE_DEVICES" not in process_env(cspec(tmp_path, None), 8000)
