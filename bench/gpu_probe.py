"""The GPU path of levers9 on a real GPU machine, without the platform: prints JSON figures.

    python3 bench/gpu_probe.py [--gpu-type H200] [--mib 256] [--iters 10] [--out FILE]

For a machine with NVIDIA GPUs, the driver and (optionally) torch and nvidia-ml-py, and nothing of
the platform (no runc, NATS, Postgres, no internet): it imports the repo's own modules from this
checkout (levers9 -> sdk/levers9, levers9.worker -> services/worker; only those that need nothing but
the standard library) and reports, each step on its own and never fatal:
1. inventory: NVML's cards (index, uuid, name, memory), the driver, what the worker would register
   for a pool of --gpu-type (detected, or configured when NVML answers nothing);
2. type mapping: each NVML name -> the pool GPU type it matches;
3. CDI: whether nvidia-ctk is on PATH, the spec `nvidia-ctk cdi generate` writes (device count and
   names) and what its edits add to a container's config.json for the chosen cards;
4. cards: what the worker's assignment gives a container of all cards, two one-card containers, and
   why it refuses one card too many;
5. distributed: levers9.distributed launches one process per card; each does torch.distributed
   all_reduce (nccl on the GPU; gloo on CPU when there is no GPU) of --mib MiB, timed;
6. checkpoints: the decision for GPU containers (driver >= 570, cuda-checkpoint, CRIU's CUDA plugin).
It ends within 2 minutes whatever happens (every step has a timeout; an alarm prints what it has)
and exits 0; a step that failed carries "error".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "sdk") not in sys.path:
    sys.path.insert(0, str(ROOT / "sdk"))
import levers9  # noqa: E402  (sdk/levers9: its __init__ needs the standard library only)

for _folder in ("services", "libs"):  # levers9.worker -> services/worker, as pyproject's package-dir maps it
    if str(ROOT / _folder) not in levers9.__path__:
        levers9.__path__.append(str(ROOT / _folder))

DEADLINE_S = 115.0
CTK_TIMEOUT_S = 30.0
DIST_TIMEOUT_S = 75.0
report: dict[str, Any] = {"started_at": time.time(), "host": platform.node(), "python": platform.python_version()}


def step(name: str, fn: Callable[[], Any]) -> Any:
    """Run one step; its figures (or its error) go into the report under `name`."""
    began = time.monotonic()
    try:
        value = fn()
        report[name] = value
    except TimeoutError as exc:  # the probe's deadline (the alarm): no further step
        report[name] = {"error": str(exc)}
        raise
    except Exception as exc:  # every step reports, none ends the probe
        value = None
        report[name] = {"error": f"{type(exc).__name__}: {exc}"}
    if isinstance(report[name], dict):
        report[name]["seconds"] = round(time.monotonic() - began, 3)
    return value


def inventory(gpu_type: str) -> dict[str, Any]:
    from levers9.worker.gpus.cards import choose_inventory, read_nvml

    try:
        import pynvml  # noqa: F401
        nvml_lib = "nvidia-ml-py importable"
    except ImportError:
        nvml_lib = "nvidia-ml-py not installed"
    detected = read_nvml()
    if detected is None and shutil.which("nvidia-smi"):  # no NVML bindings here: the same figures from nvidia-smi
        detected = smi_cards()
        nvml_lib += "; cards from nvidia-smi instead"
    inv = choose_inventory(detected, gpu_type, 0 if detected and detected.cards else 2)
    return {"nvml": nvml_lib, "detected": bool(detected and detected.cards),
            "cards": [vars(c) for c in (detected.cards if detected else ())], "driver": detected.driver if detected else "",
            "registered": inv.registration(), "source": inv.source, "note": inv.note, "_inventory": inv}


def smi_cards():
    from levers9.worker.gpus.cards import Card, Detected

    text = _run(["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,driver_version",
                 "--format=csv,noheader,nounits"], 20)
    rows = [[f.strip() for f in line.split(",")] for line in text.splitlines() if line.count(",") == 4]
    if not rows:
        return None
    return Detected(tuple(Card(int(r[0]), r[1], r[2], int(float(r[3]))) for r in rows), rows[0][4])


def mapping(inv: dict[str, Any]) -> dict[str, str]:
    from levers9.worker.gpus.cards import gpu_type_of

    names = {c["name"] for c in inv.get("cards", [])} | {"NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"}
    return {name: gpu_type_of(name) for name in sorted(names)}


def cdi_step(inv, devices: list[tuple[int, str]]) -> dict[str, Any]:
    from levers9.worker.gpus import cdi

    ctk = cdi.nvidia_ctk()
    out: dict[str, Any] = {"nvidia_ctk": ctk or ""}
    if ctk is None:
        return {**out, "note": "nvidia-ctk not on PATH: a worker here gives GPUs by NVIDIA_VISIBLE_DEVICES only"}
    out["version"] = _run([ctk, "--version"], 10).splitlines()[:1]
    with tempfile.TemporaryDirectory() as tmp:
        spec, note = cdi.generate(Path(tmp) / "nvidia.json", timeout=CTK_TIMEOUT_S)
    out["note"] = note
    if spec is None:
        return out
    out.update(kind=spec.get("kind"), cdi_version=spec.get("cdiVersion"), devices=len(spec.get("devices", [])),
               device_names=cdi.device_names(spec)[:20])
    if devices:
        names = cdi.cdi_device_names(spec, devices)
        config = cdi.apply_cdi({"process": {"env": []}, "mounts": [], "linux": {"resources": {"devices": []}}},
                               spec, names)
        out["applied"] = {"names": names, "device_nodes": [d["path"] for d in config["linux"].get("devices", [])],
                          "mounts": len(config["mounts"]), "hooks": {k: len(v) for k, v in config.get("hooks", {}).items()},
                          "env": config["process"]["env"]}
    return out


def cards_step(inv) -> dict[str, Any]:
    from levers9.worker.gpus.cards import CardLedger, CardsRefused

    ids = tuple(c.device_id for c in inv.cards)
    ledger = CardLedger(ids)
    out: dict[str, Any] = {"cards": list(ids), "all": list(ledger.take("all-cards", len(ids))) if ids else []}
    ledger.free("all-cards")
    if len(ids) >= 2:
        out["two_single"] = [list(ledger.take("one-a", 1)), list(ledger.take("one-b", 1))]
        ledger.free("one-a")
        ledger.free("one-b")
    try:
        ledger.take("too-many", len(ids) + 1)
    except CardsRefused as exc:
        out["refused"] = str(exc)
    return out


def allreduce_rank(mib: int, iters: int) -> dict[str, Any]:
    """One rank (a process of its own, launched by levers9.distributed): all_reduce timed."""
    import datetime

    env = {k: os.environ.get(k, "") for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                              "CUDA_VISIBLE_DEVICES")}
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return {"env": env, "torch": "not installed"}
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    began = time.perf_counter()
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    init_s = time.perf_counter() - began
    try:
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")  # one card visible: it is cuda:0
        if cuda:
            torch.cuda.set_device(device)
        n = max(1, mib * 1024 * 1024 // 4)
        x = torch.full((n,), float(dist.get_rank() + 1), dtype=torch.float32, device=device)
        dist.all_reduce(x)  # warm up (NCCL's communicator is made here)
        if cuda:
            torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            x.fill_(float(dist.get_rank() + 1))
            t = time.perf_counter()
            dist.all_reduce(x)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        world = dist.get_world_size()
        expected = world * (world + 1) / 2
        best = min(times)
        algbw = n * 4 / best / 1e9
        return {"env": env, "backend": backend, "torch": torch.__version__,
                "device": torch.cuda.get_device_name(device) if cuda else "cpu", "init_s": round(init_s, 3),
                "bytes": n * 4, "iters": iters, "best_s": round(best, 6), "median_s": round(sorted(times)[len(times) // 2], 6),
                "algbw_GBps": round(algbw, 2), "busbw_GBps": round(algbw * 2 * (world - 1) / world, 2),
                "correct": bool(x[0].item() == expected and x[-1].item() == expected)}
    finally:
        dist.destroy_process_group()


def distributed_step(inv, mib: int, iters: int) -> dict[str, Any]:
    import gpu_probe  # this file as a module: its rank function is then pickled by reference

    from levers9 import distributed

    ids = [c.device_id for c in inv.cards]
    os.environ["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)  # what a worker gives a container of all cards
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    began = time.monotonic()
    ranks = distributed.launch(gpu_probe.allreduce_rank, (mib, iters), nprocs=max(1, len(ids)), timeout=DIST_TIMEOUT_S)
    return {"nprocs": len(ranks), "cards": ids, "wall_s": round(time.monotonic() - began, 3), "ranks": ranks}


def checkpoint_step(inv) -> dict[str, Any]:
    from levers9.worker.checkpoints.gpu import criu_cuda_plugin, cuda_checkpoint_binary, gpu_checkpoint

    binary, plugin = cuda_checkpoint_binary(), criu_cuda_plugin(Path("/var/cache/levers9"))
    allowed, why = gpu_checkpoint(inv.driver, binary is not None, plugin is not None)
    criu = shutil.which("criu")
    return {"driver": inv.driver, "cuda_checkpoint": binary or "", "criu": criu or "",
            "criu_version": _run([criu, "--version"], 10).strip() if criu else "",
            "criu_cuda_plugin": str(plugin or ""), "allowed": allowed, "reason": why}


def _run(cmd: list[str], timeout: float) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error: {exc}"
    return done.stdout or done.stderr


def finish(out: str | None) -> None:
    report["total_s"] = round(time.time() - report["started_at"], 3)
    text = json.dumps(report, indent=2, default=str)
    print(text, flush=True)
    if out:
        Path(out).write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-type", default=os.environ.get("LEVERS9_WORKER_GPU_TYPE", "H200"))
    parser.add_argument("--mib", type=int, default=256, help="all_reduce size per rank")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    def out_of_time(signum, frame):
        raise TimeoutError(f"the probe ran past {DEADLINE_S:.0f} s")
    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(int(DEADLINE_S))
    try:
        inv_fig = step("inventory", lambda: inventory(args.gpu_type))
        inv = inv_fig.pop("_inventory") if inv_fig else None
        if inv is None:
            return 0
        step("type_mapping", lambda: mapping(inv_fig))
        step("cdi", lambda: cdi_step(inv, [(c.index, c.uuid) for c in inv.cards] if inv.source == "detected" else []))
        step("card_assignment", lambda: cards_step(inv))
        step("distributed", lambda: distributed_step(inv, args.mib, args.iters))
        step("gpu_checkpoint", lambda: checkpoint_step(inv))
    except TimeoutError as exc:
        report["error"] = str(exc)
    finally:
        signal.alarm(0)
        finish(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
