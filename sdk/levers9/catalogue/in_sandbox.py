"""What the catalogue pipeline runs inside sandboxes, through the platform's functions: standard
library only (the sandbox has the SDK's stdlib-only modules, not levers9.contracts)."""

from __future__ import annotations

from typing import Any


def measure_in_sandbox(candidates: list[tuple[str, list[str]]], repeats: int) -> list[dict[str, Any]]:
    """Runs IN the sandbox: per (distribution, modules), the median import seconds over `repeats`
    fresh interpreters, the RSS the import added (MiB), the version, and which other candidates'
    modules the import brought in."""
    import importlib.metadata
    import json
    import statistics
    import subprocess
    import sys

    probe = ("import json, sys, time\n"
             "def rss():\n"
             "    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])\n"
             "before = rss(); t = time.perf_counter()\n"
             "for m in sys.argv[1:]: __import__(m)\n"
             "print(json.dumps([time.perf_counter() - t, (rss() - before) / 1024, sorted(sys.modules)]))\n")
    owners = {m: dist for dist, modules in candidates for m in modules}
    out = []
    for dist, modules in candidates:
        runs: list[Any] = []
        for _ in range(repeats):
            proc = subprocess.run([sys.executable, "-c", probe, *modules], capture_output=True, text=True)
            if proc.returncode != 0:
                runs = []
                error = proc.stderr.strip().splitlines()[-1:] or ["failed"]
                break
            runs.append(json.loads(proc.stdout))
        if not runs:
            out.append({"distribution": dist, "modules": modules, "error": error[0]})
            continue
        loaded = {name.partition(".")[0] for name in runs[0][2]}
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = ""
        out.append({"distribution": dist, "modules": modules, "version": version,
                    "import_seconds": statistics.median(r[0] for r in runs),
                    "rss_mib": statistics.median(r[1] for r in runs),
                    "depends_on": sorted({owners[m] for m in loaded if m in owners} - {dist})})
    return out


# CPU flags that code compiled at import may rely on: a checkpoint captured where they exist cannot
# be restored where they do not (levers9.worker.sandboxes.catalogue_check compares them the same way)
CPU_FEATURES = frozenset({"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "f16c", "bmi2"})


def cpu_features(cpuinfo: str) -> list[str]:
    """The CPU_FEATURES among a /proc/cpuinfo's flags."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return sorted(CPU_FEATURES & set(line.split(":", 1)[1].split()))
    return []


def sandbox_probe() -> dict[str, Any]:
    """Runs IN the sandbox: what a restore must match (CPU features, Python)."""
    import sys

    try:
        with open("/proc/cpuinfo") as f:
            features = cpu_features(f.read())
    except OSError:
        features = []
    return {"cpu_features": features, "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}


def imports_ready(modules: list[str]) -> list[str]:
    """Runs IN the captured sandbox: which of the set's modules are imported already."""
    import sys

    return [m for m in modules if m in sys.modules]
