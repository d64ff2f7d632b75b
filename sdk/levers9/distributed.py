"""levers9.distributed: one process per GPU card of this container, wired for torch.distributed.

    import levers9.distributed
    results = levers9.distributed.run(train, epochs=3)     # [rank 0's result, rank 1's, ...]

    python -m levers9.distributed train.py --epochs 3      # the script once per card

The cards are the container's NVIDIA_VISIBLE_DEVICES (the worker sets it to the cards it gave the
container). Each rank is a fresh interpreter (`sys.executable`, like multiprocessing's spawn: no
forked CUDA state) with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (127.0.0.1: the
ranks share the container), MASTER_PORT (a free port) and CUDA_VISIBLE_DEVICES set to its one card:
- the card's uuid when the cards are uuids (NVML-detected: the same name inside and outside a container);
- inside a levers9 container with index cards, its ordinal (the container sees only its own cards,
  numbered from 0);
- elsewhere the index itself; an existing CUDA_VISIBLE_DEVICES is split among the ranks instead.
The function and its arguments travel pickled (cloudpickle when importable, so a function of the
caller's own script works; else pickle, by reference). A rank that raises ends the others, and
`RankFailed` says which rank raised what, with its traceback. Standard library only (it runs inside
containers, where this folder is mounted alone).
"""

from __future__ import annotations

import os
import pickle
import runpy
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

MASTER_ADDR = "127.0.0.1"
NO_CARDS = ("", "void", "none", "NoDevFiles")
POLL_S = 0.05
GRACE_S = 5.0  # what the other ranks get between SIGTERM and SIGKILL once one failed


class RankFailed(RuntimeError):
    """A rank raised (or died): `rank`, the exception's text and its `remote_traceback`."""

    def __init__(self, rank: int, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"rank {rank} failed: {message}" + (f"\n{remote_traceback}" if remote_traceback else ""))
        self.rank, self.remote_traceback = rank, remote_traceback


def cards(env: dict[str, str] | None = None) -> list[str]:
    """This container's cards: NVIDIA_VISIBLE_DEVICES, split (uuids or indices)."""
    value = (os.environ if env is None else env).get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if value in NO_CARDS:
        return []
    if value == "all":
        raise ValueError("NVIDIA_VISIBLE_DEVICES=all does not say how many cards: pass nprocs=")
    return [c.strip() for c in value.split(",") if c.strip()]


def device_of(local_rank: int, cards_: list[str], env: dict[str, str]) -> str:
    """CUDA_VISIBLE_DEVICES of one rank (the rules in the module docstring)."""
    parent = [c for c in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if c.strip()]
    if parent:
        if local_rank >= len(parent):
            raise ValueError(f"rank {local_rank} has no card: CUDA_VISIBLE_DEVICES lists {len(parent)}")
        return parent[local_rank].strip()
    if local_rank >= len(cards_):
        return str(local_rank)  # nprocs beyond the cards (CPU ranks, e.g. gloo): numbered on
    card = cards_[local_rank]
    if card.startswith(("GPU-", "MIG-")):
        return card
    return str(local_rank) if env.get("LEVERS9_CONTAINER_ID") else card


def rank_env(rank: int, world_size: int, master_port: int, env: dict[str, str],
             master_addr: str = MASTER_ADDR) -> dict[str, str]:
    """The environment of rank `rank` of `world_size` on this one node (pure)."""
    return {**env, "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
            "CUDA_VISIBLE_DEVICES": device_of(rank, cards(env), env)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind((MASTER_ADDR, 0))
        return s.getsockname()[1]


def _dumps(obj: Any) -> bytes:
    try:
        import cloudpickle
    except ImportError:
        return pickle.dumps(obj)
    return cloudpickle.dumps(obj)


def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
    """fn(*args, **kwargs) once per card of this container; the results in rank order."""
    return launch(fn, args, kwargs)


def launch(fn: Callable[..., Any], args: tuple = (), kwargs: dict[str, Any] | None = None,
           nprocs: int | None = None, timeout: float | None = None) -> list[Any]:
    """`run` with its options: `nprocs` (default: one per card), `timeout` in seconds for all ranks."""
    env = dict(os.environ)
    n = nprocs if nprocs is not None else len(cards(env))
    if n < 1:
        raise ValueError("no GPU cards here (NVIDIA_VISIBLE_DEVICES is empty): ask for gpu_count, or pass nprocs=")
    port = free_port()
    path = os.pathsep.join([p or os.getcwd() for p in sys.path] + [env.get("PYTHONPATH", "")]).strip(os.pathsep)
    with tempfile.TemporaryDirectory(prefix="levers9-dist-") as tmp:
        job = Path(tmp)
        (job / "call.pkl").write_bytes(_dumps((fn, tuple(args), dict(kwargs or {}))))
        procs = [subprocess.Popen([sys.executable, "-c", "from levers9.distributed import _rank_main; _rank_main()",
                                   str(job)], env={**rank_env(r, n, port, env), "PYTHONPATH": path})
                 for r in range(n)]
        first = _wait(procs, timeout)
        if first is not None:  # the rank that failed first, not one the launcher ended after it
            _result(job, first, procs[first].returncode)
        return [_result(job, r, procs[r].returncode) for r in range(n)]


def _wait(procs: list[subprocess.Popen], timeout: float | None) -> int | None:
    """Until every rank ended; once one failed (or time ran out) the others are ended too. The rank
    that failed first, or None."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
        if failed:
            _end(procs)
            return failed[0]
        if deadline is not None and time.monotonic() > deadline:
            late = [r for r, p in enumerate(procs) if p.returncode is None]
            _end(procs)
            raise RankFailed(late[0], f"ranks {late} not finished within {timeout} s")
        time.sleep(POLL_S)
    return next((r for r, p in enumerate(procs) if p.returncode != 0), None)


def _end(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _result(job: Path, rank: int, returncode: int | None) -> Any:
    try:
        status, value, tb = pickle.loads((job / f"rank{rank}.pkl").read_bytes())
    except (OSError, EOFError, pickle.UnpicklingError):
        raise RankFailed(rank, f"ended with status {returncode} and no result") from None
    if status == "ok":
        return value
    if isinstance(value, BaseException):
        raise RankFailed(rank, f"{type(value).__name__}: {value}", tb) from value
    raise RankFailed(rank, str(value), tb)


def _rank_main() -> None:
    """One rank: run the pickled call, write (status, value, traceback) for the launcher."""
    job = Path(sys.argv[1])
    out = job / f"rank{os.environ['RANK']}.pkl"
    try:
        fn, args, kwargs = pickle.loads((job / "call.pkl").read_bytes())
        record: tuple = ("ok", fn(*args, **kwargs), "")
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the launcher with its rank
        record = ("error", exc, traceback.format_exc())
    try:
        data = pickle.dumps(record)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result or exception: its text goes back
        data = pickle.dumps(("error", f"{type(exc).__name__}: {exc} (of {record[1]!r:.200})", record[2]))
    out.write_bytes(data)
    sys.exit(0 if record[0] == "ok" else 1)


def run_script(script: str, argv: list[str]) -> int:
    """One rank of `python -m levers9.distributed script.py ...`: the script as __main__; its exit code."""
    sys.argv = [script, *argv]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code:
            raise
        return 0
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m levers9.distributed SCRIPT [ARGS...]  (once per GPU card; see levers9.distributed)")
        return 2
    try:
        launch(run_script, (str(Path(argv[0]).resolve()), argv[1:]))
    except RankFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
