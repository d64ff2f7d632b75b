"""The catalogue pipeline's stages that need the running platform: measure and capture.

Both run through the platform's own Python functions, in sandboxes of the flavor's image (one image
holding every candidate package, built by the image builder on first use):

- measure: for each candidate, `import <module>` in >= 3 fresh interpreters of the sandbox, timed;
  the median, the resident memory the import added, its version and the other candidates it
  imported too (its dependencies);
- capture: for each package set, a sandbox that imports the set at load (LEVERS9_RUNNER_IMPORTS)
  with checkpoint_enabled, so the worker dumps it once ready and the checkpoint-store stores it;
  then its restore is timed (the sandbox stopped, a call made: it restores), and the sandbox
  settings it was captured with are read in the sandbox itself.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from levers9.catalogue.in_sandbox import imports_ready, measure_in_sandbox, sandbox_probe
from levers9.contracts.catalogue import PackageTiming, SandboxSettings, SharedCheckpoint
from levers9.contracts.spec import CheckpointRef

CATALOGUE_APP = "levers9-catalogue"
CAPTURE_WAIT_S = 600.0
Progress = Callable[[str], None]


def measure(image: Any, candidates: list[tuple[str, list[str]]], repeats: int, progress: Progress) -> list[PackageTiming]:
    from levers9 import App

    app = App(CATALOGUE_APP)
    fn = app.function(image=image, cpu=1, memory="2Gi", timeout=3600, keep_warm_seconds=1,
                      shared_checkpoints=False)(measure_in_sandbox)
    progress(f"measuring {len(candidates)} candidates x {repeats} fresh interpreters in the flavor's image")
    rows = fn.remote(candidates, repeats)
    timings = []
    for row in rows:
        if "error" in row:
            progress(f"  {row['distribution']}: not measured ({row['error']})")
            continue
        timings.append(PackageTiming(distribution=row["distribution"], version=row["version"],
                                     modules=row["modules"], import_seconds=round(row["import_seconds"], 4),
                                     rss_mib=round(max(0.0, row["rss_mib"]), 1), depends_on=row["depends_on"]))
        progress(f"  {row['distribution']} {row['version']}: {row['import_seconds'] * 1000:.0f} ms, "
                 f"{row['rss_mib']:.0f} MiB")
    return timings


def _capture_function(image: Any, modules: list[str], marker: str) -> Any:
    from levers9 import App

    app = App(CATALOGUE_APP)
    return app.function(image=image, cpu=1, memory="2Gi", timeout=600, checkpoint_enabled=True,
                        keep_warm_seconds=600, env={"CATALOGUE_SET": marker}, preload=modules,
                        shared_checkpoints=False)(imports_ready)


def _deployment_of(client: Any, marker: str) -> str:
    for dep in client.list_deployments():
        spec = dep.get("spec") or {}
        if (spec.get("env") or {}).get("CATALOGUE_SET") == marker:
            return str(dep["deployment_id"])
    raise RuntimeError(f"the capture sandbox's deployment ({marker}) is not listed")


def _stored_checkpoint(client: Any, deployment_id: str, progress: Progress) -> dict[str, Any]:
    deadline = time.monotonic() + CAPTURE_WAIT_S
    while time.monotonic() < deadline:
        rows = [c for c in client.list_checkpoints(all=True) if c["deployment_id"] == deployment_id]
        ready = [c for c in rows if c["status"] == "available"]
        if ready:
            return ready[0]
        failed = [c for c in rows if c["status"] in ("failed", "checkpoint_failed")]
        if failed:
            raise RuntimeError(f"the capture of {deployment_id} failed: {failed[0].get('reason')}")
        time.sleep(1.0)
    raise RuntimeError(f"no checkpoint of {deployment_id} was stored within {CAPTURE_WAIT_S:.0f} s")


def _stop_all(client: Any, deployment_id: str) -> None:
    for c in client.list_containers():
        if c["deployment_id"] == deployment_id:
            client.stop_container(c["container_id"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(c["deployment_id"] == deployment_id for c in client.list_containers()):
        time.sleep(0.2)


RESTORE_RUNS = 3  # as many as the imports are timed in (in_sandbox.py): the median of each is compared


def _timed_restore(client: Any, fn: Any, deployment_id: str, modules: list[str]) -> float:
    """The median of RESTORE_RUNS timed calls, the set's sandboxes stopped before each: each call's
    sandbox is restored from the checkpoint. One sample was not enough: the first restore also fills
    the node cache from S3, and on a busy machine one slow sample made the cost model prefer cold
    starts that the median of the imports' own timings said were slower."""
    runs = []
    for _ in range(RESTORE_RUNS):
        _stop_all(client, deployment_id)
        began = time.perf_counter()
        fn.remote(modules)
        runs.append(time.perf_counter() - began)
    return statistics.median(runs)


def capture(image: Any, image_id: str, flavor: str, sets: list[list[PackageTiming]], catalogue_id: str,
            progress: Progress) -> list[SharedCheckpoint]:
    from levers9.client import Client
    from levers9.executor.wire import GENERATION

    client = Client.from_profile()
    probe = _probe(image)
    out = []
    for i, packages in enumerate(sets):
        modules = sorted({m for p in packages for m in p.modules})
        marker = f"{catalogue_id}-{i}"
        progress(f"capturing set {i + 1}/{len(sets)}: {', '.join(p.distribution for p in packages)}")
        fn = _capture_function(image, modules, marker)
        ready = fn.remote(modules)
        if sorted(ready) != modules:
            raise RuntimeError(f"set {i}: the sandbox did not import {sorted(set(modules) - set(ready))} at load")
        deployment_id = _deployment_of(client, marker)
        stored = _stored_checkpoint(client, deployment_id, progress)
        restore_s = _timed_restore(client, fn, deployment_id, modules)
        _stop_all(client, deployment_id)  # captured: its sandbox's room goes back to the pool
        progress(f"  checkpoint {stored['checkpoint_id']}: {stored['size_bytes'] / 2**20:.0f} MiB, "
                 f"first call restored in {restore_s * 1000:.0f} ms")
        out.append(SharedCheckpoint(
            checkpoint_id=stored["checkpoint_id"], flavor=flavor, image_id=image_id, packages=packages,  # type: ignore[arg-type]
            saves_seconds=round(sum(p.import_seconds for p in packages), 4),
            memory_mib=round(sum(p.rss_mib for p in packages), 1), restore_seconds=round(restore_s, 4),
            size_bytes=int(stored["size_bytes"]),
            settings=SandboxSettings(network_mode="bridge", overlay=True, lazy_image=True, gpu="",
                                     cpu_features=probe["cpu_features"], python=probe["python"]),
            executor_generation=GENERATION, ref=CheckpointRef(
                checkpoint_id=stored["checkpoint_id"], accelerator=stored.get("accelerator") or "",
                sha256=stored.get("sha256") or "", size_bytes=int(stored["size_bytes"]),
                bucket=stored.get("bucket") or "", key=stored.get("key") or "", location=stored.get("location") or "")))
    return out


def _probe(image: Any) -> dict[str, Any]:
    from levers9 import App

    fn = App(CATALOGUE_APP).function(image=image, cpu=0.5, memory="256Mi", keep_warm_seconds=1,
                                     shared_checkpoints=False)(sandbox_probe)
    return dict(fn.remote())
