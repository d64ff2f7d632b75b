"""RuncRuntime: each app in a real container (runc, overlay root, own network namespace, cgroup).

Layout of one container, under `<state_dir>/containers/<id>/`:
    config.json  the OCI bundle spec (`bundle_spec`, a pure function)
    upper/ work/ the overlay's writable layer over the shared base root (levers9.worker.rootfs)
    rootfs/      the overlay mount
    state.json   what stop() and cleanup_all() need after a restart (address, init pid, limits)
    runc.log     runc's own log of `runc run`
runc's state lives in `<state_dir>/runc` (`runc --root`), so workers of one machine never see each
other's containers. After stop() only the log is left, moved to `<state_dir>/logs/<id>.log`.

How the process runs: init (PID 1 of the container) is a small /bin/sh script that points its own
and the app's stdio INTO the container (`/var/log/levers9/container.log`; a host file as an fd
breaks CRIU dumps), starts the app as its child, forwards SIGTERM/SIGINT/SIGHUP to it, and once
the app ended writes its status to `/var/log/levers9/exit-status` and exits with it. runc keeps no
exit status for detached containers, so that file is how poll() learns the status; sh as PID 1 also
reaps orphans. A SIGKILL of the container (stop's last resort, or the OOM killer picking sh) leaves
no file: the status is then unknown (None).

Out of memory: the cgroup v1 memory controller's `oom_kill` counter (or v2 `memory.events`) is read
before the cgroup is deleted; memory+swap are limited alike so the limit is real.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import shlex
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from levers9.runtime.config import Settings
from levers9.worker import network, rootfs
from levers9.worker.runtime import (ContainerError, ContainerSpec, Exit, Progress, Runtime, Started,
                                    _start_time, exit_of)

LOG_DIR = "/var/log/levers9"
LOG_FILE = f"{LOG_DIR}/container.log"
EXIT_FILE = f"{LOG_DIR}/exit-status"
CPU_PERIOD_US = 100_000
PIDS_LIMIT = 4096
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CAPABILITIES = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]  # `runc spec`'s default set
MASKED_PATHS = ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi"]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


# ---- the bundle (pure) ---------------------------------------------------------------------------

def init_script(command: tuple[str, ...] | list[str]) -> str:
    """The container's PID 1: run `command` with stdio inside the container, forward signals,
    record the exit status (see the module docstring)."""
    app = " ".join(shlex.quote(arg) for arg in command)
    traps = "".join(f"trap 'sig={sig}; [ -z \"$child\" ] || kill -{sig} \"$child\" 2>/dev/null' {sig}\n"
                    for sig in ("TERM", "INT", "HUP"))
    return (f"exec </dev/null >>{LOG_FILE} 2>&1\n"
            "child=; sig=\n"
            f"{traps}"
            f"{app} &\n"
            "child=$!\n"
            # a signal that came before the app had a pid
            "[ -z \"$sig\" ] || kill -\"$sig\" \"$child\" 2>/dev/null\n"
            # wait returns >128 when a trapped signal interrupts it: wait again while the app lives
            "while :; do wait \"$child\"; status=$?; kill -0 \"$child\" 2>/dev/null || break; done\n"
            f"echo \"$status\" >{EXIT_FILE}\n"
            "exit \"$status\"\n")


def container_env(spec: ContainerSpec) -> list[str]:
    """spec.env plus PATH, HOME and PYTHONPATH (the SDK first), and where the runner listens
    (LEVERS9_RUNNER_HOST/PORT unless spec.env says)."""
    env = {"LEVERS9_RUNNER_HOST": "0.0.0.0", "LEVERS9_RUNNER_PORT": str(spec.port), **spec.env,
           "PATH": PATH, "HOME": "/root"}
    env["PYTHONPATH"] = "/opt/levers9" + (f":{spec.env['PYTHONPATH']}" if spec.env.get("PYTHONPATH") else "")
    return [f"{k}={v}" for k, v in env.items()]


def bundle_spec(spec: ContainerSpec, rootfs_path: Path, netns_path: Path, *,
                cgroup_parent: str = "/levers9") -> dict:
    """The OCI config.json of a container (runc 1.1, spec 1.0.2).

    No /sys mount (CRIU restores fail with one); the process's stdio is set up inside the
    container by `init_script`; /app and /opt/levers9 are read-only binds of the host's dirs.
    """
    memory = spec.memory_mib * 1024 * 1024
    bind_ro = ["bind", "ro", "nosuid", "nodev"]
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["/bin/sh", "-c", init_script(spec.command)],
            "env": container_env(spec),
            "cwd": "/app",
            "capabilities": {kind: list(CAPABILITIES)
                             for kind in ("bounding", "effective", "permitted", "ambient")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs_path), "readonly": False},
        "hostname": spec.container_id[:63],
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
             "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/app", "type": "bind", "source": str(Path(spec.code_dir).resolve()),
             "options": bind_ro},
            {"destination": "/opt/levers9", "type": "bind", "source": str(Path(spec.sdk_dir).resolve()),
             "options": bind_ro},
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                           {"type": "network", "path": str(netns_path)}],
            "cgroupsPath": f"{cgroup_parent}/{spec.container_id}",
            "resources": {
                "devices": [{"allow": False, "access": "rwm"}],
                "memory": {"limit": memory, "swap": memory},
                "cpu": {"quota": max(1000, spec.cpu_millicores * CPU_PERIOD_US // 1000),
                        "period": CPU_PERIOD_US},
                "pids": {"limit": PIDS_LIMIT},
            },
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
        },
    }


def upper_files(spec: ContainerSpec, ip: str) -> dict[str, str]:
    """Files every container gets in its writable layer: the log, and name resolution that needs
    no network (containers have no DNS; a host resolver copied by debootstrap would make every
    lookup, e.g. http.server's getfqdn, hang for seconds)."""
    return {
        LOG_FILE: "",
        "/etc/hosts": f"127.0.0.1\tlocalhost\n::1\tlocalhost\n{ip}\t{spec.container_id[:63]}\n",
        "/etc/resolv.conf": "# levers9: no DNS; containers reach only their bridge subnet\n",
        "/etc/hostname": f"{spec.container_id[:63]}\n",
    }


def write_upper(upper: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        target = upper / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


# ---- cgroups -------------------------------------------------------------------------------------

def memory_cgroup_dir(cgroups_path: str, mountinfo: str | None = None) -> Path | None:
    """Where the memory controller keeps `cgroups_path`: the v1 `memory` hierarchy if mounted,
    else the v2 unified one."""
    if mountinfo is None:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
    v2 = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fstype, _source, options = (right.split() + ["", "", ""])[:3]
        mount_point = left.split()[4]
        if fstype == "cgroup" and "memory" in options.split(","):
            return Path(mount_point) / cgroups_path.lstrip("/")
        if fstype == "cgroup2" and v2 is None:
            v2 = Path(mount_point) / cgroups_path.lstrip("/")
    return v2


def oom_kills(cgroup_dir: Path | None) -> int:
    """How many processes the OOM killer killed in this cgroup (0 when unknown)."""
    if cgroup_dir is None:
        return 0
    for name in ("memory.oom_control", "memory.events"):  # v1, v2
        try:
            text = (cgroup_dir / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return 0


# ---- mounts --------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2


def mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    for path in (lower, upper, work):
        if any(c in str(path) for c in ",:\\"):
            raise ContainerError(f"overlay paths must not contain ',', ':' or '\\': {path}")
    options = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    if _libc.mount(b"overlay", str(target).encode(), b"overlay", 0, options) != 0:
        err = ctypes.get_errno()
        raise ContainerError(f"mounting the overlay at {target}: {os.strerror(err)}")


def unmount(target: Path) -> None:
    """Unmount `target` if it is a mount point (lazily if busy)."""
    for _ in range(8):  # overlays stacked on the same point come off one by one
        if not is_mount_point(target):
            return
        if _libc.umount2(str(target).encode(), 0) != 0:
            err = ctypes.get_errno()
            if err == errno.EBUSY:
                _libc.umount2(str(target).encode(), MNT_DETACH)
            elif err in (errno.EINVAL, errno.ENOENT):
                return
            else:
                raise ContainerError(f"unmounting {target}: {os.strerror(err)}")
    if is_mount_point(target):
        raise ContainerError(f"{target} is still mounted")


def is_mount_point(path: Path) -> bool:
    return str(Path(path)) in _mount_points()


def _mount_points() -> set[str]:
    with open("/proc/self/mountinfo") as f:
        return {line.split()[4].replace("\\040", " ") for line in f}


# ---- the runtime ---------------------------------------------------------------------------------

@dataclass
class _Container:
    container_id: str
    ip: str
    port: int
    memory_mib: int
    pid: int = 0
    started: int | None = None  # the init's start time (tells a reused pid apart)
    stop_requested: bool = False


class RuncRuntime(Runtime):
    name = "runc"
    features = ["runc"]

    def __init__(self, state_dir: Path, settings: Settings, runc: str | None = None):
        super().__init__(state_dir, settings)
        self.runc = runc or shutil.which("runc", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") \
            or "runc"
        self.runc_root = self.state_dir / "runc"
        self.ipam = network.Ipam(settings.bridge_name, settings.bridge_subnet)
        self._base: Path | None = None
        self._bridge_ready = False
        self._live: dict[str, _Container] = {}
        self._ended: dict[str, Exit] = {}  # stopped (torn down)
        self._exited: dict[str, Exit] = {}  # seen ended by poll(), not stopped yet
        self._locks: dict[str, asyncio.Lock] = {}

    # -- setup --

    async def prepare(self, progress: Progress = lambda s: None) -> None:
        """The base root (built once per machine, minutes) and the bridge."""
        for d in (self.containers_dir, self.logs_dir, self.runc_root):
            d.mkdir(parents=True, exist_ok=True)
        if self._base is None:
            loop = asyncio.get_running_loop()

            def threadsafe(line: str) -> None:
                loop.call_soon_threadsafe(progress, line)

            self._base = await asyncio.to_thread(rootfs.ensure_base_rootfs,
                                                 Path(self.settings.image_cache), threadsafe)
        if not self._bridge_ready:
            addr = await network.ensure_bridge(self.settings.bridge_name, self.settings.bridge_subnet)
            progress(f"bridge {self.settings.bridge_name} up at {addr}")
            self._bridge_ready = True

    def container_dir(self, container_id: str) -> Path:
        return self.containers_dir / container_id

    def names(self, container_id: str) -> network.Names:
        return network.Names.of(self.state_dir, container_id)

    def log_path(self, container_id: str) -> Path:
        live = self.container_dir(container_id) / "upper" / LOG_FILE.lstrip("/")
        return live if live.exists() else self.logs_dir / f"{container_id}.log"

    # -- start --

    async def start(self, spec: ContainerSpec) -> Started:
        await self.prepare()
        assert self._base is not None
        cid = spec.container_id
        cdir = self.container_dir(cid)
        try:
            cdir.mkdir()
        except FileExistsError:
            raise ContainerError(f"container {cid} exists already (stop it first)") from None
        self._ended.pop(cid, None)
        self._exited.pop(cid, None)
        rec = _Container(cid, ip="", port=spec.port, memory_mib=spec.memory_mib)
        try:
            names = self.names(cid)
            rec.ip = self.ipam.claim(cid, self.state_dir, names.netns)
            self._save(rec)
            write_upper(cdir / "upper", upper_files(spec, rec.ip))
            for sub in ("work", "rootfs"):
                (cdir / sub).mkdir()
            mount_overlay(self._base, cdir / "upper", cdir / "work", cdir / "rootfs")
            await network.attach(names, self.settings.bridge_name, self.settings.bridge_subnet, rec.ip)
            config = bundle_spec(spec, cdir / "rootfs", network.netns_path(names))
            (cdir / "config.json").write_text(json.dumps(config, indent=1))
            await self._run(cid, cdir)
            rec.pid = int((cdir / "init.pid").read_text())
            rec.started = _start_time(rec.pid)
            self._save(rec)
        except BaseException:
            await self._teardown(cid, keep_log=True)
            raise
        self._live[cid] = rec
        return Started(address=f"http://{rec.ip}:{spec.port}", pid=rec.pid,
                       log_path=self.log_path(cid))

    async def _run(self, cid: str, cdir: Path) -> None:
        # stdio of runc is /dev/null: the container inherits it (and our pipes would never close);
        # runc's errors go to its --log file
        log = cdir / "runc.log"
        proc = await asyncio.create_subprocess_exec(
            self.runc, "--root", str(self.runc_root), "--log", str(log), "--log-format", "json",
            "run", "-d", "--bundle", str(cdir), "--pid-file", str(cdir / "init.pid"), cid,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        if await proc.wait() != 0:
            raise ContainerError(f"runc run {cid} failed: {_runc_error(log)}")

    # -- state --

    async def poll(self, container_id: str) -> Exit | None:
        if container_id in self._ended:
            return self._ended[container_id]
        rec = self._record(container_id)
        if rec is None:
            raise KeyError(container_id)
        if container_id in self._exited:  # ended, not stopped yet: no more runc calls
            return self._exited[container_id]
        if await self._is_running(rec):
            return None
        self._exited[container_id] = self._exit(rec)
        return self._exited[container_id]

    async def _is_running(self, rec: _Container) -> bool:
        # fast path: the init process is alive and no zombie (no exec of runc)
        if rec.pid and rec.started is not None and _start_time(rec.pid) == rec.started \
                and _proc_state(rec.pid) not in ("Z", "X", None):
            return True
        state = await self._state(rec.container_id)
        return state is not None and state.get("status") in ("running", "created", "paused")

    async def _state(self, cid: str) -> dict | None:
        rc, out, _ = await self._runc_cmd("state", cid)
        if rc != 0:
            return None  # "container does not exist"
        try:
            return json.loads(out)
        except ValueError:
            return None

    def _exit(self, rec: _Container) -> Exit:
        """What ended the container; read before its cgroup is deleted."""
        status_file = self.container_dir(rec.container_id) / "upper" / EXIT_FILE.lstrip("/")
        try:
            code: int | None = int(status_file.read_text().strip())
        except (OSError, ValueError):
            code = None
        oom = oom_kills(memory_cgroup_dir(f"/levers9/{rec.container_id}")) > 0
        return exit_of(code, oom=oom, memory_mib=rec.memory_mib, stop_requested=rec.stop_requested)

    def running(self) -> list[str]:
        return [cid for cid in self._live if cid not in self._ended]

    # -- stop --

    async def stop(self, container_id: str, timeout: float = 10) -> Exit:
        lock = self._locks.setdefault(container_id, asyncio.Lock())
        async with lock:
            if container_id in self._ended and container_id not in self._live:
                return self._ended[container_id]
            rec = self._record(container_id)
            if rec is None:
                await self._teardown(container_id)  # a half-made one, if anything
                return Exit(None, "stopped")
            ended = await self._stop_process(rec, timeout)
            await self._teardown(container_id)
            self._live.pop(container_id, None)
            self._exited.pop(container_id, None)
            self._ended[container_id] = ended
            return ended

    async def _stop_process(self, rec: _Container, timeout: float) -> Exit:
        if await self._is_running(rec):
            rec.stop_requested = True
            await self._runc_cmd("kill", rec.container_id, "TERM")
            if not await self._wait_stopped(rec, timeout):
                await self._runc_cmd("kill", "--all", rec.container_id, "KILL")
                await self._wait_stopped(rec, 5)
        return self._exit(rec)

    async def _wait_stopped(self, rec: _Container, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if not await self._is_running(rec):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)

    async def _teardown(self, cid: str, keep_log: bool = True) -> None:
        """Remove everything of a container but its log; every step tolerates a missing piece."""
        cdir = self.container_dir(cid)
        rc, _, err = await self._runc_cmd("delete", "-f", cid)
        if rc != 0 and "does not exist" not in err and "not exist" not in err:
            raise ContainerError(f"runc delete {cid}: {err.strip()}")
        unmount(cdir / "rootfs")
        await network.detach(self.names(cid))
        self.ipam.release_owned(cid, self.state_dir)
        if keep_log:
            live_log = cdir / "upper" / LOG_FILE.lstrip("/")
            if live_log.exists():
                self.logs_dir.mkdir(parents=True, exist_ok=True)
                os.replace(live_log, self.logs_dir / f"{cid}.log")
        if cdir.exists():
            if any(m == str(cdir) or m.startswith(f"{cdir}/") for m in _mount_points()):
                raise ContainerError(f"{cdir} still has mounts; not removing it")
            shutil.rmtree(cdir, ignore_errors=True)

    async def cleanup_all(self) -> list[str]:
        found: set[str] = set()
        if self.containers_dir.is_dir():
            found |= {d.name for d in self.containers_dir.iterdir() if d.is_dir()}
        rc, out, _ = await self._runc_cmd("list", "--format", "json")
        if rc == 0 and out.strip() not in ("", "null"):
            found |= {c["id"] for c in json.loads(out)}
        # address claims of this state dir whose container dir is gone (a crash mid-teardown)
        found |= {c.container_id for c in self.ipam.claims() if c.state_dir == str(self.state_dir)}
        found -= set(self._live)
        for cid in sorted(found):
            await self._teardown(cid)
            self._ended.pop(cid, None)
        return sorted(found)

    # -- helpers --

    def _save(self, rec: _Container) -> None:
        path = self.container_dir(rec.container_id) / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(rec)))
        tmp.replace(path)

    def _record(self, cid: str) -> _Container | None:
        """The live record, or the one saved by an earlier run of this worker."""
        if cid in self._live:
            return self._live[cid]
        try:
            return _Container(**json.loads((self.container_dir(cid) / "state.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    async def _runc_cmd(self, *args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            self.runc, "--root", str(self.runc_root), *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        return proc.returncode or 0, out.decode(), err.decode()


def _runc_error(log: Path) -> str:
    """The error lines of runc's json log, or its tail."""
    try:
        lines = log.read_text().splitlines()
    except OSError:
        return "(no runc log)"
    errors = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("level") in ("error", "fatal"):
            errors.append(entry.get("msg", ""))
    return "; ".join(errors) or " | ".join(lines[-3:]) or "(empty runc log)"


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
