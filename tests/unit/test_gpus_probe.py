"""bench/gpu_probe.py on a machine without a GPU (this one): it reports a configured inventory, the
per-card ranks and why GPU checkpoints are off, and exits 0, with the standard library alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).resolve().parents[2] / "bench" / "gpu_probe.py"


def test_the_probe_reports_cleanly_without_a_gpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEVERS9_", "CUDA_", "NVIDIA_"))}
    done = subprocess.run([sys.executable, "-S", str(PROBE), "--gpu-type", "H200", "--out", str(tmp_path / "p.json")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == json.loads((tmp_path / "p.json").read_text())
    assert "error" not in report and all("error" not in v for v in report.values() if isinstance(v, dict))
    inv = report["inventory"]
    assert (inv["detected"], inv["source"], inv["registered"]["gpu_type"]) == (False, "configured", "H200")
    assert report["type_mapping"]["NVIDIA H200"] == "H200"
    assert report["card_assignment"]["two_single"] == [["0"], ["1"]] and "3 GPU(s) asked" in report["card_assignment"]["refused"]
    ranks = report["distributed"]["ranks"]
    assert [(r["env"]["RANK"], r["env"]["WORLD_SIZE"], r["env"]["CUDA_VISIBLE_DEVICES"]) for r in ranks] == \
        [("0", "2", "0"), ("1", "2", "1")]
    assert report["gpu_checkpoint"]["allowed"] is False
    assert report["gpu_checkpoint"]["reason"] == "no NVIDIA driver detected (configured inventory)"
