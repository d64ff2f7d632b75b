"""Benchmark: the first call of an endpoint restored from a CRIU checkpoint, against a cold start.

Starts the whole stack (`levers9 up` in a temporary home, one local worker with the runc runtime and
CRIU; pools file min_warm = 1, max_workers = 1) and deploys one app file with two endpoints that run
the same code:

  bench-restore       checkpoint_enabled=True: its first cold container is dumped (leave-running)
                      once ready; the checkpoint-store puts it in S3; every later start restores it
  bench-restore-cold  the twin, checkpoint_enabled=False: every start is cold (how COLD is measured)

Both import numpy and pandas, and on_start builds a pandas DataFrame of --rows rows (ints, floats and a
string key; sorted by key; grouped by key) — about 3 s on one core — and keeps it in memory; the
handler returns figures derived from the table and a random nonce made in on_start (a restored
container must answer with the nonce of the container that was dumped). cpu 1, memory 1Gi,
keep_warm_seconds 1.

Measured in one run (each "call" waits until no container of either endpoint is live, then makes one
call, and times it from the request sent to the answer received):

  cold           --calls calls of the twin (cold starts)
  restored       --calls calls of bench-restore: restores from the node cache (the blob is on disk)
  bare           --bare restores of the same checkpoint tar straight through RuncRuntime.restore()
                 (like tests/integration/test_checkpoint_runtime.py), until GET /_levers9/health answers 200:
                 the runtime-level restore, without the platform around it
  restored_s3    --s3-calls calls of bench-restore with the node cache's file deleted first: the node
                 cache fills it from S3 (SeaweedFS on this machine) before the restore
  dump           the worker's "checkpoint <id> of <container>: N bytes in S s" log lines, the
                 checkpoint's size_bytes (GET /api/v1/checkpoints), the upload time
                 (CheckpointDumped -> CheckpointStored); --extra-dumps more dumps are made by deleting
                 the checkpoint (DELETE /api/v1/checkpoints/{id}) and calling bench-restore once more
                 (a cold start that takes a new checkpoint; those calls are reported apart)

cold, restored and bare are interleaved (one of each per round), so load from other work on this
shared machine hits all three alike. Every call is split into phases with the `occurred_at` of its
container's events (`levers9 events replay --json --aggregate container`): gateway (sent ->
ContainerRequested), placement (-> Scheduled), worker (-> Started), ready (-> Ready), proxy
(-> answer); and `worker` once more at the birth time (statx) of the container's log file, which a
cold start creates when runtime.start begins and a restore unpacks from the tar (images first, the
upper layer with the log last): so for a restore `fetch_unpack` = pick-up + node cache + sha256
check of the tar + unpacking, and `criu` = the rest of restore() (overlay, network, `runc restore`).

Targets: restored first call >= 5x faster than cold (p50); the platform's restore within 2x of the
bare restore (p50).

  python bench/bench_restore.py [--calls 10] [--s3-calls 5] [--bare 5] [--extra-dumps 2] [--rows N]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import shutil
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import log, verdict, write_results  # noqa: E402
from bench_cold_call import Stack, birth_time, running_stack, summarize  # noqa: E402

TARGET_SPEEDUP = 5.0  # restored first call vs cold, p50
TARGET_PLATFORM_OVER_BARE = 2.0  # platform restore vs bare runtime restore, p50
BLOBS = Path("/var/cache/levers9/blobs")
LOG_IN_CONTAINER = "var/log/levers9/container.log"
MAIN, TWIN = "bench-restore", "bench-restore-cold"
PHASES = ("gateway", "placement", "worker", "fetch_unpack", "criu", "pickup", "runc_start", "ready", "proxy",
          "total")

APP = '''
import os
import random
import time

from levers9 import App

if os.environ.get("LEVERS9_CONTAINER_ID"):  # in the container: imported when the module loads
    import numpy as np
    import pandas as pd
else:  # `levers9 deploy` imports the file on a machine that may not have them
    try:
        import numpy as np
        import pandas as pd
    except ModuleNotFoundError:
        np = pd = None

app = App("bench-restore")
ROWS = __ROWS__


def build():
    """A large in-memory table: ROWS rows (id, a string key, two floats), sorted by key, grouped."""
    began = time.perf_counter()
    rng = np.random.default_rng()
    df = pd.DataFrame({"id": np.arange(ROWS, dtype=np.int64),
                       "key": pd.Series(rng.integers(0, 50_000, ROWS)).map(lambda k: f"k{k:05d}"),
                       "x": rng.random(ROWS), "y": rng.standard_normal(ROWS)})
    df = df.sort_values(["key", "x"], kind="stable").reset_index(drop=True)
    stats = df.groupby("key").agg(x_mean=("x", "mean"), y_sum=("y", "sum"), n=("id", "size"))
    summary = {"rows": int(len(df)), "groups": int(len(stats)), "x_sum": float(df["x"].sum()),
               "top_key": str(stats["n"].idxmax()), "table_mib": round(df.memory_usage(deep=True).sum() / 2**20, 1),
               "nonce": random.random(), "built_at": time.time(), "pid": os.getpid(),
               "on_start_s": round(time.perf_counter() - began, 3)}
    return {"df": df, "stats": stats, "summary": summary}


def answer(context):
    s = context.on_start_value
    return {**s["summary"], "first_key": str(s["df"]["key"].iloc[0]), "y_sum_total": float(s["stats"]["y_sum"].sum())}


OPTIONS = dict(cpu=1, memory="1Gi", keep_warm_seconds=1, on_start=build, timeout=120)


@app.endpoint(name="bench-restore", checkpoint_enabled=True, **OPTIONS)
def bench_restore(context):
    return answer(context)


@app.endpoint(name="bench-restore-cold", checkpoint_enabled=False, **OPTIONS)
def bench_restore_cold(context):
    return answer(context)
'''

DUMP_LINE = re.compile(r"checkpoint (\S+) of (\S+): (\d+) bytes in ([0-9.]+) s")


def ts(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(stack: Stack, method: str, path: str, **kw) -> httpx.Response:
    r = stack.http.request(method, path, **kw)
    r.raise_for_status()
    return r


def cache_stats(cache_url: str) -> dict:
    try:
        return httpx.get(f"{cache_url}/stats", timeout=10).json()
    except httpx.HTTPError as exc:
        return {"error": str(exc)}


def wait_quiet(stack: Stack) -> None:
    """No container of either endpoint is live (both scaled to zero), plus a small margin for the
    gateway's router to learn of the stop."""
    stack.wait_no_live(MAIN, timeout=90)
    stack.wait_no_live(TWIN, timeout=90)
    time.sleep(0.2)


FAILED: list[dict] = []  # calls answered 502 (then made again), with why


def one_call(stack: Stack, name: str, kind: str = "", attempts: int = 3, prepare=None) -> dict:
    """One call after a quiet wait. A 502 (the container went away before the gateway reached it) is
    recorded in FAILED and the call is made again, up to `attempts` times. `prepare()` runs just
    before each attempt."""
    for attempt in range(attempts):
        wait_quiet(stack)
        if prepare is not None:
            prepare()
        sent = time.time()
        t0 = time.perf_counter()
        r = stack.http.post(f"/endpoint/{name}", json={})
        total_ms = (time.perf_counter() - t0) * 1000
        if r.status_code == 200:
            break
        if r.status_code != 502 or attempt == attempts - 1:
            raise RuntimeError(f"{name} answered {r.status_code}: {r.text[:500]}")
        FAILED.append({"endpoint": name, "kind": kind, "status": r.status_code, "total_ms": round(total_ms, 1),
                       "container_id": r.headers.get("x-levers9-container-id", ""), "detail": r.text[:500],
                       "at": sent})
        log(f"{name} ({kind}) answered 502 after {total_ms:.0f} ms: {r.text[:200]}; calling again")
    return {"endpoint": name, "kind": kind, "container_id": r.headers["x-levers9-container-id"], "sent": sent,
            "received": sent + total_ms / 1000, "total_ms": total_ms, "body": r.json()}


def checkpoints_of(stack: Stack, deployment_id: str) -> list[dict]:
    rows = api(stack, "GET", "/api/v1/checkpoints", params={"all": "true"}).json()
    return [c for c in rows if c["deployment_id"] == deployment_id]


def wait_available(stack: Stack, deployment_id: str, not_in: set[str], timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in checkpoints_of(stack, deployment_id):
            if c["checkpoint_id"] in not_in:
                continue
            if c["status"] == "available":
                return c
            if c["status"] in ("checkpoint_failed", "failed", "upload_failed"):
                raise RuntimeError(f"checkpoint {c['checkpoint_id']} is {c['status']}: {c.get('reason')}")
        time.sleep(0.2)
    raise RuntimeError(f"no available checkpoint of {deployment_id} within {timeout:.0f} s: "
                       f"{checkpoints_of(stack, deployment_id)}")


def dump_lines(home: Path) -> dict[str, dict]:
    out = {}
    for path in sorted((home / "logs").glob("worker*.log")):
        for line in path.read_text(errors="replace").splitlines():
            m = DUMP_LINE.search(line)
            if m:
                out[m.group(1)] = {"checkpoint_id": m.group(1), "container_id": m.group(2),
                                   "size_bytes": int(m.group(3)), "seconds": float(m.group(4))}
    return out


def all_events(stack: Stack, aggregate: str) -> dict[str, list[dict]]:
    out = stack.cli("events", "replay", "--json", "--aggregate", aggregate, timeout=300)
    by_id: dict[str, list[dict]] = {}
    key = f"{aggregate}_id"
    for line in out.splitlines():
        if line.startswith("{"):
            e = json.loads(line)
            by_id.setdefault(e.get("data", {}).get(key, ""), []).append(e)
    return by_id


def phases(call: dict, events: list[dict], log_birth: float | None) -> dict:
    at: dict[str, float] = {}
    for e in events:
        at.setdefault(e["type"], ts(e["occurred_at"]))
    need = ("ContainerRequested", "ContainerScheduled", "ContainerStarted", "ContainerReady")
    missing = [t for t in need if t not in at]
    if missing:
        raise RuntimeError(f"container {call['container_id']} has no {missing} (events: {[e['type'] for e in events]})")
    ms = lambda a, b: round((b - a) * 1000, 3)  # noqa: E731
    out = {"gateway": ms(call["sent"], at["ContainerRequested"]),
           "placement": ms(at["ContainerRequested"], at["ContainerScheduled"]),
           "worker": ms(at["ContainerScheduled"], at["ContainerStarted"]),
           "ready": ms(at["ContainerStarted"], at["ContainerReady"]),
           "proxy": ms(at["ContainerReady"], call["received"]),
           "total": round(call["total_ms"], 3)}
    if log_birth is not None:
        if call.get("restored"):
            out["fetch_unpack"] = ms(at["ContainerScheduled"], log_birth)
            out["criu"] = ms(log_birth, at["ContainerStarted"])
        else:
            out["pickup"] = ms(at["ContainerScheduled"], log_birth)
            out["runc_start"] = ms(log_birth, at["ContainerStarted"])
    out["_occurred_at"] = {t: at[t] for t in need}
    return out


# ---- the bare restore: RuncRuntime.restore() of the same tar, in this process ----------------------

class Bare:
    def __init__(self, state_dir: Path, tar: Path, code_dir: Path, memory_mib: int, cpu_millicores: int) -> None:
        from levers9.runtime.config import Settings
        from levers9.worker.runtime.runc.runc_runtime import RuncRuntime
        self.loop = asyncio.new_event_loop()
        self.rt = RuncRuntime(state_dir, Settings().with_(runtime="runc"))
        self.tar, self.code_dir = tar, code_dir
        self.memory_mib, self.cpu_millicores = memory_mib, cpu_millicores
        import levers9
        self.sdk_dir = Path(levers9.__file__).resolve().parent.parent
        self.run(self.rt.prepare())
        self.criu = self.run(self.rt.enable_checkpoints())

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def restore_once(self, expect_nonce: float | None) -> dict:
        return self.run(self._restore_once(expect_nonce))

    async def _restore_once(self, expect_nonce: float | None) -> dict:
        from levers9.worker.runtime.interface import ContainerSpec
        spec = ContainerSpec(container_id=f"bare-{uuid.uuid4().hex[:12]}", code_dir=self.code_dir,
                             sdk_dir=self.sdk_dir, env={}, cpu_millicores=self.cpu_millicores,
                             memory_mib=self.memory_mib)
        began_wall = time.time()
        t0 = time.perf_counter()
        started = await self.rt.restore(spec, self.tar)
        restored = time.perf_counter()
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if (await client.get(f"{started.address}/_levers9/health")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{started.address} did not answer within 30 s")
                    await asyncio.sleep(0.005)
                answered = time.perf_counter()
                body = (await client.post(f"{started.address}/", json={}, timeout=30)).json()
            birth = birth_time(self.rt.container_dir(spec.container_id) / "upper" / LOG_IN_CONTAINER)
        finally:
            await self.rt.stop(spec.container_id, timeout=5)
        out = {"container_id": spec.container_id, "total_ms": round((answered - t0) * 1000, 3),
               "restore_ms": round((restored - t0) * 1000, 3),
               "http_after_restore_ms": round((answered - restored) * 1000, 3),
               "nonce_matches": expect_nonce is None or body.get("nonce") == expect_nonce}
        if birth is not None:
            out["unpack_ms"] = round((birth - began_wall) * 1000, 3)
            out["criu_ms"] = round((began_wall + (restored - t0) - birth) * 1000, 3)
        return out

    def close(self) -> None:
        try:
            for cid in self.rt.running():
                self.run(self.rt.stop(cid, timeout=2))
        finally:
            self.loop.close()


def sha_check_ms(tar: Path, sha: str, times: int = 3) -> list[float]:
    """What the worker's tar_is_valid (a sha256 of the whole tar, on every restore) costs here."""
    from levers9.worker.checkpoints.archive import tar_is_valid
    out = []
    for _ in range(times):
        t0 = time.perf_counter()
        ok = tar_is_valid(tar, sha)
        out.append(round((time.perf_counter() - t0) * 1000, 3))
        if not ok:
            raise RuntimeError(f"{tar} does not hash to {sha}")
    return out


def stat_row(values: list[float]) -> dict:
    return summarize(values) if values else {}


def table(rows: list[tuple[str, dict, str]]) -> str:
    lines = [f"{'measure':<44} {'n':>3} {'p50 ms':>9} {'min ms':>9} {'max ms':>9}  note"]
    for label, s, note in rows:
        if s:
            lines.append(f"{label:<44} {s['n']:>3} {s['p50_ms']:>9.0f} {s['min_ms']:>9.0f} {s['max_ms']:>9.0f}  {note}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10, help="cold calls and node-cache restores (interleaved)")
    ap.add_argument("--bare", type=int, default=5, help="bare RuncRuntime restores (in the first rounds)")
    ap.add_argument("--s3-calls", type=int, default=5, help="restores with the node cache's file deleted first")
    ap.add_argument("--extra-dumps", type=int, default=2,
                    help="more dumps: delete the checkpoint, call once (cold), wait for the new one")
    ap.add_argument("--rows", type=int, default=2_000_000, help="rows of the app's DataFrame")
    ap.add_argument("--keep-home", action="store_true", help="leave the stack's home (logs) for reading")
    args = ap.parse_args()

    # a node cache of this stack's own (the first worker of a node serves it, by default on 2050, and
    # another stack on this machine may hold that port: its S3 is not ours, and its counters mix)
    cache_port = free_port()
    os.environ["LEVERS9_CACHE_PORT"] = str(cache_port)
    cache_url = f"http://127.0.0.1:{cache_port}"
    load_before = os.getloadavg()
    run_began = time.monotonic()
    calls: list[dict] = []
    bare_runs: list[dict] = []
    dumps_cold: list[dict] = []
    bare: Bare | None = None
    tmp_tar_dir: Path | None = None
    with running_stack(args.keep_home) as stack:
        try:
            deadline = time.monotonic() + 300
            while True:
                workers = [w for w in api(stack, "GET", "/api/v1/workers").json() if w["status"] == "ready"]
                if workers and "criu" in workers[0].get("features", []):
                    break
                if workers and time.monotonic() > deadline - 240:
                    raise RuntimeError(f"the worker has no CRIU: {workers[0]}")
                if time.monotonic() > deadline:
                    raise RuntimeError("no ready worker within 300 s")
                time.sleep(0.5)
            log(f"worker {workers[0].get('worker_id')} ready with CRIU; node cache {cache_url}")
            stack.deploy(APP.replace("__ROWS__", str(args.rows)), "bench_restore_app")

            # the first call of bench-restore: cold, fills the code cache, and its container is dumped
            first = one_call(stack, MAIN, "first (cold, dumped)")
            dep_id = api(stack, "GET", f"/api/v1/containers/{first['container_id']}").json()["deployment_id"]
            ck = wait_available(stack, dep_id, set())
            log(f"first call {first['total_ms']:.0f} ms (on_start {first['body']['on_start_s']} s in the "
                f"container, table {first['body']['table_mib']} MiB); checkpoint {ck['checkpoint_id']} "
                f"available: {ck['size_bytes'] / 2**20:.1f} MiB")
            calls.append(first)
            nonce = first["body"]["nonce"]
            sha = ck["sha256"]
            blob = BLOBS / sha
            # the tar for the bare restores: a copy (the S3 phase deletes the node cache's file)
            tmp_tar_dir = stack.home / "bare"
            tmp_tar_dir.mkdir()
            shutil.copyfile(blob, tmp_tar_dir / "checkpoint.tar")
            sha_ms = sha_check_ms(tmp_tar_dir / "checkpoint.tar", sha)
            log(f"sha256 check of the tar (tar_is_valid): {sha_ms} ms")
            warm_twin = one_call(stack, TWIN, "first of the twin (not counted)")
            calls.append(warm_twin)
            code_dir = next(p for p in (stack.worker_dir() / "code").iterdir() if p.is_dir() and ".tmp" not in p.name)
            bare = Bare(tmp_tar_dir / "state", tmp_tar_dir / "checkpoint.tar", code_dir, memory_mib=1024,
                        cpu_millicores=1000)

            for i in range(args.calls):
                c = one_call(stack, TWIN, "cold")
                calls.append(c)
                r = one_call(stack, MAIN, "restored")
                r["blob_present_before"] = True
                calls.append(r)
                line = f"round {i + 1}/{args.calls}: cold {c['total_ms']:.0f} ms, restored {r['total_ms']:.0f} ms"
                if i < args.bare:
                    wait_quiet(stack)
                    b = bare.restore_once(nonce)
                    bare_runs.append(b)
                    line += f", bare {b['total_ms']:.0f} ms"
                log(line)
            for i in range(args.bare - len(bare_runs)):  # if --bare > --calls
                wait_quiet(stack)
                bare_runs.append(bare.restore_once(nonce))

            for i in range(args.s3_calls):
                before: dict = {}

                def drop_blob() -> None:
                    blob.unlink(missing_ok=True)
                    before.clear()
                    before.update(cache_stats(cache_url))
                r = one_call(stack, MAIN, "restored_s3", prepare=drop_blob)
                after = cache_stats(cache_url)
                r["cache_delta"] = {k: after.get(k, 0) - before.get(k, 0) for k in ("hits", "misses", "fills_s3")
                                    if isinstance(after.get(k), int)}
                calls.append(r)
                log(f"S3 restore {i + 1}/{args.s3_calls}: {r['total_ms']:.0f} ms, node cache {r['cache_delta']}")

            seen = {ck["checkpoint_id"]}
            for i in range(args.extra_dumps):
                wait_quiet(stack)
                for c in checkpoints_of(stack, dep_id):
                    if c["status"] == "available":
                        api(stack, "DELETE", f"/api/v1/checkpoints/{c['checkpoint_id']}")
                deadline = time.monotonic() + 30
                while any(c["status"] == "available" for c in checkpoints_of(stack, dep_id)):
                    if time.monotonic() > deadline:
                        raise RuntimeError("a deleted checkpoint is still available after 30 s")
                    time.sleep(0.1)
                d = one_call(stack, MAIN, "cold_after_delete")
                calls.append(d)
                new = wait_available(stack, dep_id, seen)
                seen.add(new["checkpoint_id"])
                dumps_cold.append({"checkpoint_id": new["checkpoint_id"], "size_bytes": new["size_bytes"]})
                log(f"extra dump {i + 1}/{args.extra_dumps}: cold call {d['total_ms']:.0f} ms, checkpoint "
                    f"{new['checkpoint_id']} {new['size_bytes'] / 2**20:.1f} MiB")
            wait_quiet(stack)
            time.sleep(0.5)  # the last one's log moves to <worker>/logs when it stops
            measured_s = time.monotonic() - run_began

            # what happened, from the log and the API
            events = all_events(stack, "container")
            ck_events = all_events(stack, "checkpoint")
            rows = {cid: api(stack, "GET", f"/api/v1/containers/{cid}").json()
                    for cid in {c["container_id"] for c in calls}}
            dump_log = dump_lines(stack.home)
            all_cks = checkpoints_of(stack, dep_id)
            logs = stack.worker_dir() / "logs"
            for c in calls:
                row = rows[c["container_id"]]
                c["restored_from"], c["note"] = row.get("restored_from") or "", row.get("note") or ""
                c["restored"] = bool(c["restored_from"])
                c["nonce_matches"] = c["body"].get("nonce") == nonce
                c["phases"] = phases(c, events.get(c["container_id"], []),
                                     birth_time(logs / f"{c['container_id']}.log"))
            cache_final = cache_stats(cache_url)
            answered = {c["container_id"] for c in calls}
            for f in FAILED:  # what happened to the container the gateway could not reach
                if not f["container_id"]:  # a 502 names no container: the one requested during that call
                    f["container_id"] = next(
                        (cid for cid, evs in events.items() if cid and cid not in answered and evs
                         and f["at"] <= ts(evs[0]["occurred_at"]) <= f["at"] + f["total_ms"] / 1000), "")
                evs = events.get(f["container_id"], [])
                at = {e["type"]: ts(e["occurred_at"]) for e in evs}
                f["events"] = [{"type": e["type"], "occurred_at": e["occurred_at"],
                                **{k: v for k, v in e["data"].items() if k in ("reason", "note", "address")}}
                               for e in evs]
                if {"ContainerReady", "ContainerStopped"} <= at.keys():
                    f["ready_to_stopped_ms"] = round((at["ContainerStopped"] - at["ContainerReady"]) * 1000, 1)
        finally:
            if bare is not None:
                bare.close()
    load_after = os.getloadavg()

    # ---- figures --------------------------------------------------------------------------------
    def of(kind: str) -> list[dict]:
        return [c for c in calls if c["kind"] == kind]

    cold, restored, s3 = of("cold"), of("restored"), of("restored_s3")
    wrong = [c for c in restored + s3 if not c["restored"] or not c["nonce_matches"]]
    if wrong:
        log(f"WARNING: {len(wrong)} calls meant to restore did not (or served another state): "
            + "; ".join(f"{c['container_id']}: {c['note']}" for c in wrong))
    restored_ok = [c for c in restored if c["restored"] and c["nonce_matches"]]
    s3_ok = [c for c in s3 if c["restored"] and c["nonce_matches"]]
    cold_ok = [c for c in cold if not c["restored"]]

    def phase_stats(group: list[dict]) -> dict:
        keys = [p for p in PHASES if any(p in c["phases"] for c in group)]
        return {p: stat_row([c["phases"][p] for c in group if p in c["phases"]]) for p in keys}

    stats = {"cold": phase_stats(cold_ok), "restored": phase_stats(restored_ok), "restored_s3": phase_stats(s3_ok)}
    bare_stats = {k: stat_row([b[k] for b in bare_runs if k in b])
                  for k in ("total_ms", "restore_ms", "unpack_ms", "criu_ms", "http_after_restore_ms")}
    cold_p50 = stats["cold"]["total"]["p50_ms"]
    rest_p50 = stats["restored"]["total"]["p50_ms"]
    s3_p50 = stats["restored_s3"]["total"]["p50_ms"] if s3_ok else None
    bare_p50 = bare_stats["total_ms"]["p50_ms"]
    speedup = cold_p50 / rest_p50
    platform_over_bare = rest_p50 / bare_p50

    dumps = []
    for ck_row in sorted(all_cks, key=lambda c: c["created_at"]):
        cid = ck_row["checkpoint_id"]
        evs = {e["type"]: ts(e["occurred_at"]) for e in ck_events.get(cid, [])}
        line = dump_log.get(cid, {})
        ready_at = next((ts(e["occurred_at"]) for e in events.get(ck_row.get("container_id", ""), [])
                         if e["type"] == "ContainerReady"), None)
        dumps.append({"checkpoint_id": cid, "status": ck_row["status"], "size_bytes": ck_row["size_bytes"],
                      "worker_log_seconds": line.get("seconds"), "worker_log_bytes": line.get("size_bytes"),
                      "ready_to_dumped_ms": round((evs["CheckpointDumped"] - ready_at) * 1000, 1)
                      if ready_at and "CheckpointDumped" in evs else None,
                      "upload_ms": round((evs["CheckpointStored"] - evs["CheckpointDumped"]) * 1000, 1)
                      if {"CheckpointStored", "CheckpointDumped"} <= evs.keys() else None})
    dump_s = [d["worker_log_seconds"] for d in dumps if d["worker_log_seconds"] is not None]
    sizes = [d["size_bytes"] for d in dumps]
    upload = [d["upload_ms"] for d in dumps if d["upload_ms"] is not None]

    print(f"\nrestore vs cold, one worker (runc + CRIU), app: pandas DataFrame of {args.rows:,} rows built in "
          f"on_start ({statistics.median(c['body']['on_start_s'] for c in cold_ok):.2f} s in the container, "
          f"p50), cpu 1, 1Gi\n")
    print(table([
        ("first call, COLD (twin, checkpoints off)", stats["cold"]["total"], ""),
        ("first call, RESTORED from node cache", stats["restored"]["total"],
         f"{speedup:.1f}x faster than cold (target >= {TARGET_SPEEDUP:.0f}x)"),
        ("first call, RESTORED from S3 (cache file deleted)", stats["restored_s3"].get("total", {}), ""),
        ("bare RuncRuntime.restore() -> HTTP 200", bare_stats["total_ms"],
         f"platform/bare {platform_over_bare:.2f}x (target <= {TARGET_PLATFORM_OVER_BARE:.0f}x)"),
        ("  of which restore() returns", bare_stats["restore_ms"], ""),
        ("  of which unpack (to log birth)", bare_stats["unpack_ms"], ""),
        ("  of which criu/runc restore (after unpack)", bare_stats["criu_ms"], ""),
        ("sha256 check of the tar (tar_is_valid)", stat_row(sha_ms), "done by the worker on every restore"),
        ("dump, worker log (checkpoint() total)", stat_row([s * 1000 for s in dump_s]), ""),
        ("upload to S3 (CheckpointDumped->Stored)", stat_row(upload), ""),
    ]))
    print(f"\ncheckpoint size: {', '.join(f'{s / 2**20:.1f}' for s in sizes)} MiB")
    print("\nphases, p50 ms (cold / restored / restored from S3):")
    for p in PHASES:
        vals = [stats[k].get(p, {}).get("p50_ms") for k in ("cold", "restored", "restored_s3")]
        if any(v is not None for v in vals):
            print(f"  {p:<13} " + " / ".join("-" if v is None else f"{v:.0f}" for v in vals))
    print(f"\nrestored first call {rest_p50:.0f} ms vs cold {cold_p50:.0f} ms: {speedup:.1f}x "
          f"(target >= {TARGET_SPEEDUP:.0f}x): {verdict(speedup, TARGET_SPEEDUP)}")
    print(f"platform restore {rest_p50:.0f} ms vs bare restore {bare_p50:.0f} ms: {platform_over_bare:.2f}x "
          f"(target <= {TARGET_PLATFORM_OVER_BARE:.0f}x): "
          f"{verdict(platform_over_bare, TARGET_PLATFORM_OVER_BARE, higher_is_better=False)}")
    print(f"run took {measured_s:.0f} s (stack up to last call)")
    for f in FAILED:
        print(f"502 ({f['kind']}): container {f['container_id']}: Ready -> Stopped "
              f"{f.get('ready_to_stopped_ms')} ms; " + "; ".join(
                  f"{e['type']} {e.get('reason', '')}".strip() for e in f.get("events", [])))

    write_results("restore", {
        "app": f"numpy + pandas; on_start builds a DataFrame of {args.rows} rows (int id, string key, 2 floats), "
               "sorts and groups it; cpu 1, memory 1Gi, keep_warm_seconds 1",
        "stack": "levers9 up on this machine: one local worker (min_warm=1, max_workers=1), runc + CRIU 4.2.1; "
                 f"node cache on its own port ({cache_port}); S3 is SeaweedFS on loopback",
        "cold_method": "twin endpoint bench-restore-cold (same code, checkpoint_enabled=False), interleaved "
                       "with the restores",
        "loadavg_before": load_before, "loadavg_after": load_after, "run_seconds": round(measured_s, 1),
        "summary_p50_ms": {"cold": cold_p50, "restored_node_cache": rest_p50, "restored_s3": s3_p50,
                           "bare_restore_to_http": bare_p50,
                           "sha256_check": stat_row(sha_ms).get("p50_ms"),
                           "dump_seconds": dump_s, "checkpoint_size_bytes": sizes, "upload_ms": upload},
        "speedup_restored_vs_cold": round(speedup, 2),
        "platform_over_bare": round(platform_over_bare, 2),
        "targets": {"speedup_min": TARGET_SPEEDUP, "platform_over_bare_max": TARGET_PLATFORM_OVER_BARE},
        "verdicts": {"speedup": verdict(speedup, TARGET_SPEEDUP),
                     "platform_over_bare": verdict(platform_over_bare, TARGET_PLATFORM_OVER_BARE,
                                                   higher_is_better=False)},
        "phases": stats, "bare": {"stats": bare_stats, "runs": bare_runs},
        "dumps": dumps, "failed_calls": FAILED, "not_restored": [{"container_id": c["container_id"], "kind": c["kind"], "note": c["note"]}
                                         for c in wrong],
        "node_cache_stats_end": cache_final,
        "calls": [{k: v for k, v in c.items() if k not in ("sent", "received")} for c in calls],
    })


if __name__ == "__main__":
    main()
