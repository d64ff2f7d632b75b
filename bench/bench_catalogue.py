"""Benchmark: shared pre-import checkpoints on the held-out part of the corpus, side by side with none.

Starts the whole stack (`levers9 up` in a temporary home), runs `levers9 catalogue build` with the
default corpus (scikit-learn's and networkx's examples), then turns each sampled held-out script's
imports into a function (a module of its own, so the client's `ast` finds its imports) and makes
its first call twice, each on a sandbox of its own (a new function, so nothing is warm):

  shared   as the cost model picks (a shared checkpoint, or cold when that is cheaper)
  none     the same function with shared_checkpoints=False (cold, the same catalogue image)

Reports first-call p50/p95 for both and the speed-up; a function importing numpy, pandas and
scikit-learn (target p50 <= 300 ms); the cost model's regret per call, against the candidates that
were measured for it ((chosen - best) / best, the best of the shared and the cold first call); and the
grouping's expected seconds saved per held-out call and memory for greedy, one checkpoint with
everything, and none (from the pipeline's groups.json).

Targets (issue 10): p50 >= 5x faster than without; numpy+pandas+sklearn p50 <= 300 ms; regret p50 <= 10 %.

  python bench/bench_catalogue.py [--sample 16] [--top 8]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import log, percentiles, verdict, write_results  # noqa: E402
from bench_cold_call import running_stack  # noqa: E402

TARGET_SPEEDUP = 5.0
TARGET_SCI_P50_MS = 300.0
TARGET_REGRET_P50 = 0.10
EXCLUDED = ("geopandas", "libpysal", "contextily", "cartopy", "annoy")  # heavy native stacks: not in the image

MODULE = '''from levers9 import App

app = App("bench-catalogue")


@app.function(cpu=1, memory="2Gi", keep_warm_seconds=1, shared_checkpoints={shared}, name="{name}")
def call():
{imports}    return 1
'''


def imports_of(path: Path) -> list[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(errors="replace"))):
        if isinstance(node, ast.Import):
            names |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return sorted(n for n in names if n not in sys.stdlib_module_names and n != "__future__")


def first_call(tmp: Path, name: str, modules: list[str], shared: bool) -> float:
    """Milliseconds to the first result of a new function importing `modules`."""
    body = "".join(f"    import {m}  # noqa: F401\n" for m in modules)
    path = tmp / f"{name.replace('-', '_')}.py"
    path.write_text(MODULE.format(shared=shared, name=name, imports=body))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    began = time.perf_counter()
    module.call.remote()
    return (time.perf_counter() - began) * 1000


def importable(modules: list[str], measured: set[str]) -> list[str]:
    table = {"sklearn": "scikit-learn", "mpl_toolkits": "matplotlib"}
    return [m for m in modules if table.get(m, m) in measured]


def build(env: dict, top: int, work: Path) -> dict:
    args = [sys.executable, "-m", "levers9", "catalogue", "build", "--top", str(top), "--work-dir", str(work),
            "--json", *[x for e in EXCLUDED for x in ("--exclude", e)]]
    began = time.monotonic()
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"levers9 catalogue build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out = proc.stdout
    log(f"catalogue built in {time.monotonic() - began:.0f} s")
    return json.loads(out.strip().splitlines()[-1])


def compare(tmp: Path, files: list[Path], measured: set[str], run_id: str) -> dict:
    shared, cold, regrets = [], [], []
    for i, f in enumerate(files):
        modules = importable(imports_of(f), measured)
        s = first_call(tmp, f"h{i}-s-{run_id}", modules, True)
        c = first_call(tmp, f"h{i}-c-{run_id}", modules, False)
        shared.append(s)
        cold.append(c)
        regrets.append((s - min(s, c)) / min(s, c))
        log(f"  {f.name}: {modules} shared {s:.0f} ms, none {c:.0f} ms")
    p50s, p50c = statistics.median(shared), statistics.median(cold)
    return {"calls": len(files), "shared": percentiles(shared), "none": percentiles(cold),
            "speedup_p50": round(p50c / p50s, 2), "verdict": verdict(p50c / p50s, TARGET_SPEEDUP),
            "regret": {"p50": round(statistics.median(regrets), 3), "max": round(max(regrets), 3),
                       "verdict": verdict(statistics.median(regrets), TARGET_REGRET_P50, higher_is_better=False)}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sample", type=int, default=16)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    run_id = str(int(time.time()))[-6:]
    with running_stack() as stack, tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        os.environ["LEVERS9_HOME"] = str(stack.home)
        env = {**os.environ}
        work = tmp / "work"
        built = build(env, args.top, work)
        catalogue = json.loads((work / "catalogue.json").read_text())["result"]
        measured = {p["distribution"] for p in catalogue["packages"]}
        held = [Path(p) for p in json.loads((work / "corpus.json").read_text())["result"]["held_out"]]
        files = [f for f in held if importable(imports_of(f), measured)][: args.sample]
        sys.path.insert(0, str(tmp))
        doc = {"catalogue": {"checkpoints": [[p["distribution"] for p in c["packages"]] for c in catalogue["checkpoints"]],
                             "memory_mib": sum(c["memory_mib"] for c in catalogue["checkpoints"]),
                             "grouping": built["scores"]}}
        log(f"held-out calls ({len(files)}) ...")
        doc["held_out"] = compare(tmp, files, measured, run_id)
        sci = [first_call(tmp, f"sci{i}-{run_id}", ["numpy", "pandas", "sklearn"], True) for i in range(5)]
        doc["numpy_pandas_sklearn"] = {**percentiles(sci),
                                       "verdict": verdict(statistics.median(sci), TARGET_SCI_P50_MS, False)}
    write_results("bench_catalogue", doc)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
