"""Where workers come from. `Backend` is the interface; `LocalBackend` starts worker processes on
this machine. The other backends (backends_netns, backends_k8s, backends_cluster) implement the same
calls on top of this module; backend_choice.make_backend picks one for a pool."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from abc import ABC, abstractmethod
from pathlib import Path

from levers9.runtime.config import Settings
from levers9.runtime.credentials import without_credentials, worker_env
from levers9.runtime.ports import free_port

from .pools import PoolConfig


class Backend(ABC):
    name: str

    @abstractmethod
    def start_worker(self, pool: PoolConfig, worker_id: str, token: str) -> None:
        """Start a worker that will register itself as `worker_id` using `token`."""

    @abstractmethod
    def stop_worker(self, worker_id: str) -> None:
        """Stop it gracefully (it stops its containers and leaves)."""

    @abstractmethod
    def exited(self) -> list[str]:
        """Workers this backend knows have died (faster than waiting for the heartbeat to expire)."""

    def note(self, pool: PoolConfig) -> str:
        """What the pool's last decision should add (e.g. why its last start failed); "" for nothing."""
        return ""

    def reaper_where(self, worker_id: str) -> tuple[list[str], dict[str, str]]:
        """Where a lost worker's reaper runs: a command prefix and settings, ([], {}) for this machine
        as this controller sees it."""
        return [], {}


class LocalBackend(Backend):
    """Worker processes on this machine, each in its own session, logging to $LEVERS9_HOME/logs.
    They inherit this controller's LEVERS9_* settings (servers, gateway, home)."""

    name = "local"

    def __init__(self, home: Path, issuer: str = "", settings: Settings | None = None) -> None:
        self.home = home
        self.issuer = issuer  # home/nats/auth when NATS runs with auth: each worker gets its own user
        self.settings = settings or Settings.load()
        self.procs: dict[str, subprocess.Popen] = {}

    def start_worker(self, pool: PoolConfig, worker_id: str, token: str) -> None:
        env = {**worker_base_env(pool.name, self.settings.pools.worker_credentials), "LEVERS9_SERVICE": "worker", "LEVERS9_WORKER_ID": worker_id,
               "LEVERS9_WORKER_POOL": pool.name, "LEVERS9_WORKER_TOKEN": token,
               "LEVERS9_HTTP_PORT": str(free_port()), "LEVERS9_HOME": str(self.home),
               "LEVERS9_WORKER_CPU_MILLICORES": str(pool.worker_cpu_millicores),
               "LEVERS9_WORKER_MEMORY_MIB": str(pool.worker_memory_mib),
               "LEVERS9_WORKER_CRIU": "auto" if pool.criu else "off",
               "LEVERS9_WORKER_GPU_TYPE": pool.gpu_type, "LEVERS9_WORKER_GPU_COUNT": str(pool.gpus_per_worker),
               # `levers9 up` restarting its own worker leaves this one alone (levers9.stack MANAGED_ENV)
               "LEVERS9_WORKER_MANAGED_BY": "pool-controller", **worker_bus_env(self.issuer, worker_id)}
        cmd, env = self.where(worker_id, [sys.executable, "-m", "levers9", "service", "worker"], env)
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"worker-{worker_id}.log").open("ab") as log:
            self.procs[worker_id] = subprocess.Popen(cmd, env=env, stdout=log, stderr=log,
                                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def where(self, worker_id: str, cmd: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """The command and environment that run this worker: here, as they are (backends_netns: in a host)."""
        return cmd, env

    def stop_worker(self, worker_id: str) -> None:
        proc = self.procs.get(worker_id)
        if proc and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    def exited(self) -> list[str]:
        gone = [wid for wid, p in self.procs.items() if p.poll() is not None]
        for wid in gone:
            self.procs.pop(wid)
        return gone


def worker_base_env(pool: str, directory: str) -> dict[str, str]:
    """This controller's environment without its own credentials, with the workers' of `pool` (files
    `levers9 up` wrote in `directory`, the setting worker_credentials); as it is when none are named."""
    if not directory:
        return dict(os.environ)
    return {**without_credentials(os.environ), **worker_env(directory, pool)}


def worker_bus_env(issuer: str, worker_id: str) -> dict[str, str]:
    """The worker's own NATS user (minted now, for it alone) and the workers' signing key; never the
    controller's own user, key or issuer, which the environment would otherwise pass on."""
    cleared = {"LEVERS9_NATS_CREDS": "", "LEVERS9_BUS_SIGNING_KEY": "", "LEVERS9_NATS_ISSUER": ""}
    if not issuer:
        return cleared
    from levers9.runtime.nats_issuer import Issuer

    iss = Issuer(issuer)
    return {**cleared, "LEVERS9_NATS_CREDS": str(iss.worker_creds(worker_id)),
            "LEVERS9_BUS_SIGNING_KEY": str(iss.signing_path("worker"))}


def worker_bus_files(issuer: str, worker_id: str) -> dict[str, str]:
    """What a worker elsewhere (a pod) gets as files: its own NATS user (minted now, for it alone),
    the workers' signing key and the signers' public keys; none when NATS runs without auth."""
    if not issuer:
        return {}
    from levers9.runtime import nats_auth
    from levers9.runtime.nats_issuer import Issuer

    iss = Issuer(issuer)
    creds, _ = iss.mint(nats_auth.worker_tag(worker_id), nats_auth.worker_permissions(worker_id))
    return {"nats.creds": creds, "worker.sign": iss.signing_path("worker").read_text(),
            "signers.json": iss.signers_path.read_text()}
