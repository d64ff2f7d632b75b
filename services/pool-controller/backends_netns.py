"""Pool backend `netns`: each worker is its own host, for real on one machine (levers9.runtime.hosts).

A worker process of this backend runs in a network namespace of its own (`nsenter --net`: only the
network, so its FUSE, JuiceFS and overlay mounts stay the machine's and its cleanup sees them), with
its own address on the underlay bridge, its own container bridge and subnet, its own node cache
directory, and the servers' URLs at the underlay's host side (whose published ports alone lead to
them). What the worker serves (its HTTP, node cache, executor relay, its published containers) is at
its host address. The host goes when its worker has exited; `levers9 down` removes what is left.
"""

from __future__ import annotations

from pathlib import Path

from levers9.runtime import hosts
from levers9.runtime.config import Settings

from .backends import LocalBackend


class NetnsBackend(LocalBackend):
    name = "netns"

    def __init__(self, home: Path, issuer: str = "", settings: Settings | None = None) -> None:
        super().__init__(home, issuer, settings)
        self.hosts: dict[str, hosts.HostPlan] = {}

    @property
    def markers(self) -> Path:
        return self.home / "hosts" / "live"

    def urls(self) -> dict[str, str]:
        return {key: self.settings.get(key) for key in hosts.URL_KEYS}

    def where(self, worker_id: str, cmd: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        s = self.settings
        hosts.ensure_underlay(s.network.hosts_bridge, s.network.hosts_subnet, self.urls().values(), owner=self.markers)
        plan = hosts.add_host(s.network.hosts_bridge, s.network.hosts_subnet, s.network.hosts_container_supernet, self.markers)
        self.hosts[worker_id] = plan
        # the worker's own server URLs (its database role's DSN), else this controller's
        urls = {key: env.get(f"LEVERS9_{key.upper()}") or url for key, url in self.urls().items()}
        env = {**env, **hosts.host_env(plan, urls, s.network.hosts_subnet, self.home)}
        return ["nsenter", f"--net={hosts.NETNS_DIR / plan.netns}", "--", *cmd], env

    def exited(self) -> list[str]:
        gone = super().exited()
        for worker_id in gone:
            plan = self.hosts.pop(worker_id, None)
            if plan is not None:
                hosts.remove_host(plan)
                (self.markers / plan.netns).unlink(missing_ok=True)
        return gone

    def reaper_where(self, worker_id: str) -> tuple[list[str], dict[str, str]]:
        """In the worker's host namespace, with its bridge and subnet, while that host is still there
        (the worker's containers' veths, address claims and firewall are its bridge's); once the host
        is gone (removed with its worker) so are they, and the reaper runs here."""
        plan = self.hosts.get(worker_id)
        if plan is None or not (hosts.NETNS_DIR / plan.netns).exists():
            return [], {}
        env = hosts.host_env(plan, {}, self.settings.network.hosts_subnet, self.home)
        return ["nsenter", f"--net={hosts.NETNS_DIR / plan.netns}", "--"], env

    def host_of(self, worker_id: str) -> hosts.HostPlan | None:
        return self.hosts.get(worker_id)
