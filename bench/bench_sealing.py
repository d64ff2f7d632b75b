"""Benchmark: sealing and opening a checkpoint archive (levers9.runtime.sealing), the cost the
checkpoint-store adds to an upload and the node cache to a fill from S3. In memory, no servers:
an archive of --mib MiB (random bytes: the worst case, nothing compresses anyway) fed in 1 MiB
chunks, as the upload and the fill stream it. Prints MB/s of each and writes
bench/results/sealing.json. A typical archive: the e2e stateful app's dump is ~100 MB.

  python bench/bench_sealing.py [--mib 256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from levers9.runtime.sealing import ArchiveOpener, ArchiveSealer, rotated


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ring, chunk = rotated(None), 1 << 20
    data = os.urandom(args.mib << 20)
    seal_s, open_s = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        s = ArchiveSealer(ring, "s3://bench/checkpoint.tar")
        parts = [s.header()] + [s.update(data[i:i + chunk]) for i in range(0, len(data), chunk)] + [s.finish()]
        t1 = time.perf_counter()
        o = ArchiveOpener(ring, "s3://bench/checkpoint.tar")
        out = [o.update(p) for p in parts] + [o.finish()]
        t2 = time.perf_counter()
        assert sum(map(len, out)) == len(data)
        seal_s.append(t1 - t0)
        open_s.append(t2 - t1)
    mb = len(data) / 1e6
    result = {"mib": args.mib, "rounds": args.rounds, "cpus": os.cpu_count(),
              "seal_mb_s": round(mb / statistics.median(seal_s)), "open_mb_s": round(mb / statistics.median(open_s)),
              "overhead_bytes": sum(map(len, parts)) - len(data)}
    print(json.dumps(result))
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "sealing.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
