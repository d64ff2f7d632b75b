"""RuncRuntime: each app in a real container (runc, overlay root, own network namespace, cgroup).

Layout of one container, under `<state_dir>/containers/<id>/`:
    config.json  the OCI bundle spec (`bundle_spec`, a pure function)
    upper/ work/ the overlay's writable layer over the shared base root (levers9.worker.rootfs)
    rootfs/      the overlay mount
    state.json   what stop() and cleanup_all() need after a restart (address, init pid, limits)
    spec.json    the spec fields a checkpoint's manifest carries (env, cpu, memory, command, port)
    criu.conf    CRIU's options for this container, named by the `org.criu.config` annotation
    runc.log     runc's own log of `runc run` (or `runc restore`)
runc's state lives in `<state_dir>/runc` (`runc --root`), so workers of one machine never see each
other's containers. After stop() only the log is left, moved to `<state_dir>/logs/<id>.log`.

Checkpoint/restore (CRIU, see levers9.worker.criu and levers9.worker.checkpoint): checkpoint()
pauses the container, dumps it leave-running with `runc checkpoint`, copies its upper layer, thaws
it, and writes one tar; restore() unpacks such a tar into a new container dir with a new network
namespace and address and runs `runc restore`. Dumps are staged in `<state_dir>/checkpoints/`.

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
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from levers9.runtime.config import Settings
from levers9.worker import checkpoint as ckpt
from levers9.worker import network, rootfs
from levers9.worker.criu import CriuInfo, ensure_criu
from levers9.worker.runtime import (ContainerError, ContainerSpec, Exit, Progress, Runtime, Started,
                                    _start_time, exit_of)

KEEP_UNPACKED = 3  # checkpoints kept unpacked per worker for fast restores
LOG_DIR = "/var/log/levers9"
LOG_FILE = f"{LOG_DIR}/container.log"
EXIT_FILE = f"{LOG_DIR}/exit-status"
CRIU_LOG_LIMIT = 256 << 20  # a CRIU log past this means CRIU loops (see RuncRuntime._criu_job)
CRIU_CONF = "criu.conf"  # in the container dir: CRIU's options for this container (runc reads it)
SPEC_FILE = "spec.json"  # in the container dir: the spec fields a checkpoint's manifest keeps
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
                cgroup_parent: str = "/levers9", criu_config: Path | None = None) -> dict:
    """The OCI config.json of a container (runc 1.1, spec 1.0.2).

    No /sys mount (CRIU restores fail with one); the process's stdio is set up inside the
    container by `init_script`; /app and /opt/levers9 are read-only binds of the host's dirs.
    `criu_config`: the CRIU configuration file runc hands to CRIU for this container (annotation
    `org.criu.config`; without it runc would use the machine-wide /etc/criu/runc.conf).
    """
    memory = spec.memory_mib * 1024 * 1024
    bind_ro = ["bind", "ro", "nosuid", "nodev"]
    config = {
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
    if criu_config is not None:
        config["annotations"] = {"org.criu.config": str(criu_config)}
    return config


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


def spec_record(spec: ContainerSpec) -> dict:
    """The fields of a spec that a checkpoint carries to its restores (host paths are not)."""
    return {"env": dict(spec.env), "cpu_millicores": spec.cpu_millicores,
            "memory_mib": spec.memory_mib, "command": list(spec.command), "port": spec.port}


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
        self._criu: CriuInfo | None = None  # set by use_criu(): checkpoints on
        self.dump_timeout = 300.0  # seconds runc checkpoint may take (the container is paused)
        self.restore_timeout = 60.0  # seconds runc restore may take before it counts as failed
        self.criu_log_limit = CRIU_LOG_LIMIT
        self._base_id: str | None = None

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

    async def _new_container_dir(self, cid: str, error: type[Exception]) -> Path:
        """The directory of a new container (start or restore); `error` if the id is taken."""
        await self.prepare()
        assert self._base is not None
        cdir = self.container_dir(cid)
        try:
            cdir.mkdir()
        except FileExistsError:
            raise error(f"container {cid} exists already (stop it first)") from None
        self._ended.pop(cid, None)
        self._exited.pop(cid, None)
        return cdir

    async def start(self, spec: ContainerSpec) -> Started:
        cid = spec.container_id
        cdir = await self._new_container_dir(cid, ContainerError)
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
            await self._forget_neighbor(rec.ip)
            # CRIU's options for a later dump of this container (not the machine-wide runc.conf),
            # and what a checkpoint's manifest needs of the spec
            (cdir / CRIU_CONF).write_text(ckpt.dump_config())
            (cdir / SPEC_FILE).write_text(json.dumps(spec_record(spec)))
            config = bundle_spec(spec, cdir / "rootfs", network.netns_path(names),
                                 criu_config=cdir / CRIU_CONF)
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
            _thaw(f"/levers9/{cid}")  # a worker that died mid-checkpoint left it paused
            await _kill_cgroup(f"/levers9/{cid}")  # ... or mid-restore: CRIU and its tasks
            self._unmount_criu_leftovers(cid)
            await self._teardown(cid)
            if not (self.runc_root / cid / "state.json").exists():  # runc's half-made restore
                shutil.rmtree(self.runc_root / cid, ignore_errors=True)
            _remove_cgroups(f"/levers9/{cid}")
            self._ended.pop(cid, None)
        scratch = self.state_dir / "checkpoints"  # dumps a dead worker did not finish
        if scratch.is_dir():
            for left in scratch.iterdir():
                if left.name.split(".", 1)[0] not in self._live:
                    shutil.rmtree(left, ignore_errors=True)
        return sorted(found)

    # -- checkpoint / restore (CRIU) --

    def use_criu(self, info: CriuInfo) -> None:
        """Arm checkpoint() and restore() with a working CRIU (levers9.worker.criu.ensure_criu)."""
        self._criu = info

    async def enable_checkpoints(self, progress: Progress = lambda s: None) -> CriuInfo:
        """Find or make CRIU (a minute the first time on a machine) and use it; CriuUnavailable
        says why not."""
        info = await ensure_criu(Path(self.settings.image_cache), progress)
        self.use_criu(info)
        return info

    @property
    def checkpoint_ready(self) -> bool:
        return self._criu is not None

    def memory_usage(self, container_id: str) -> int | None:
        """Bytes the container's memory cgroup holds now (what a dump roughly writes), None if unknown."""
        cgroup = memory_cgroup_dir(f"/levers9/{container_id}")
        for name in ("memory.usage_in_bytes", "memory.current"):  # v1, v2
            try:
                return int((cgroup / name).read_text()) if cgroup else None
            except (OSError, ValueError):
                continue
        return None

    async def checkpoint(self, container_id: str, out_tar: Path) -> ckpt.CheckpointArtifact:
        """Dump the running container into `out_tar`; it keeps running (and serving).

        The container is frozen (runc pause) for the dump AND the copy of its writable layer, so
        the files match the memory image (CRIU checks the size of every open file on restore:
        the log grows while a leave-running container serves). Then it is thawed and the tar is
        written outside the pause."""
        criu = self._criu
        if criu is None:
            raise ckpt.CheckpointError("checkpoints are off here: no working CRIU (use_criu was not called)")
        cid = container_id
        lock = self._locks.setdefault(cid, asyncio.Lock())
        async with lock:
            rec = self._record(cid)
            if rec is None or cid in self._ended or not await self._is_running(rec):
                raise ckpt.CheckpointError(f"container {cid} is not running")
            cdir = self.container_dir(cid)
            try:
                spec = json.loads((cdir / SPEC_FILE).read_text())
                hostname = json.loads((cdir / "config.json").read_text()).get("hostname", cid)
            except (OSError, ValueError) as exc:
                raise ckpt.CheckpointError(f"container {cid} has no readable spec: {exc}") from exc
            scratch = self.state_dir / "checkpoints" / f"{cid}.{uuid.uuid4().hex[:8]}"
            images, work, upper = scratch / ckpt.IMAGES, scratch / "work", scratch / ckpt.UPPER
            work.mkdir(parents=True)
            began = time.monotonic()
            try:
                rc, _, err = await self._runc_cmd("pause", cid)
                if rc != 0:
                    raise ckpt.CheckpointError(f"runc pause {cid}: {err.strip()}")
                paused = time.monotonic()
                try:
                    runc_log = scratch / "runc.log"
                    failed = await self._criu_job(
                        ["--log", str(runc_log), "--log-format", "json", "--criu", str(criu.binary),
                         "checkpoint", "--leave-running", "--image-path", str(images),
                         "--work-path", str(work), cid],
                        work / "dump.log", self.dump_timeout, cid, kill_container=False)
                    dumped = time.monotonic()
                    if failed is not None:
                        raise ckpt.CheckpointError(
                            f"CRIU could not dump {cid}: {failed or _criu_reason(work / 'dump.log', runc_log)}")
                    await _copy_tree(cdir / "upper", upper)
                finally:
                    rc, _, err = await self._runc_cmd("resume", cid)
                    thawed = time.monotonic()
                    if rc != 0:
                        raise ckpt.CheckpointError(f"runc resume {cid} after the dump: {err.strip()}")
                manifest = ckpt.make_manifest(
                    container_id=cid, hostname=hostname, ip=rec.ip, env=spec["env"],
                    cpu_millicores=spec["cpu_millicores"], memory_mib=spec["memory_mib"],
                    command=spec["command"], port=spec["port"], base=await self._base_identity(),
                    criu_version=criu.version, created_at=time.time())
                size, sha = await asyncio.to_thread(ckpt.write_tar, Path(out_tar), manifest,
                                                    images, upper)
            finally:
                await asyncio.to_thread(shutil.rmtree, scratch, True)
            return ckpt.CheckpointArtifact(size_bytes=size, sha256=sha,
                                                 seconds=time.monotonic() - began,
                                                 dump_seconds=dumped - paused,
                                                 paused_seconds=thawed - paused, manifest=manifest)

    async def restore(self, spec: ContainerSpec, tar: Path) -> Started:
        """Restore the checkpoint `tar` as the new container `spec.container_id`: its own network
        namespace and address, a fresh overlay whose upper layer comes from the tar; code and SDK
        from `spec` (host paths), limits from `spec`; env, command and port are the dumped ones
        (they live in the restored memory). On failure nothing of it is left (RestoreError)."""
        criu = self._criu
        if criu is None:
            raise ckpt.RestoreError("checkpoints are off here: no working CRIU (use_criu was not called)")
        cid = spec.container_id
        cdir = await self._new_container_dir(cid, ckpt.RestoreError)
        rec = _Container(cid, ip="", port=spec.port, memory_mib=spec.memory_mib)
        try:
            template, manifest = await self._unpacked(Path(tar))
            if manifest["base"] != await self._base_identity():
                raise ckpt.RestoreError(
                    "the checkpoint was made on a different base root file system (its python and "
                    "libraries would not match the dumped memory)")
            rec.port = manifest["port"]
            names = self.names(cid)
            rec.ip = self.ipam.claim(cid, self.state_dir, names.netns)
            self._save(rec)
            # the writable layer is this container's own copy; the images are read in place
            await _run_checked(["cp", "-a", str(template / ckpt.UPPER), str(cdir / "upper")])
            # /etc/hosts names the new address; the host name stays (the UTS namespace is restored)
            write_upper(cdir / "upper", {"/etc/hosts": f"127.0.0.1\tlocalhost\n::1\tlocalhost\n"
                                                       f"{rec.ip}\t{manifest['hostname']}\n"})
            for sub in ("work", "rootfs"):
                (cdir / sub).mkdir()
            mount_overlay(self._base, cdir / "upper", cdir / "work", cdir / "rootfs")
            await network.attach(names, self.settings.bridge_name, self.settings.bridge_subnet, rec.ip)
            await self._forget_neighbor(rec.ip)
            restored = ContainerSpec(container_id=cid, code_dir=spec.code_dir, sdk_dir=spec.sdk_dir,
                                     env=manifest["env"], cpu_millicores=spec.cpu_millicores,
                                     memory_mib=spec.memory_mib, command=tuple(manifest["command"]),
                                     port=manifest["port"])
            (cdir / SPEC_FILE).write_text(json.dumps(spec_record(restored)))
            # mntns-compat-mode for this restore only: CRIU refuses it on a later dump of this one
            (cdir / CRIU_CONF).write_text(ckpt.restore_config())
            config = bundle_spec(restored, cdir / "rootfs", network.netns_path(names),
                                 criu_config=cdir / CRIU_CONF)
            config["hostname"] = manifest["hostname"]
            (cdir / "config.json").write_text(json.dumps(config, indent=1))
            await self._restore(cid, cdir, template / ckpt.IMAGES, criu)
            (cdir / CRIU_CONF).write_text(ckpt.dump_config())
            rec.pid = int((cdir / "init.pid").read_text())
            rec.started = _start_time(rec.pid)
            self._save(rec)
        except BaseException as exc:
            try:
                await self._undo_restore(cid)
            except Exception as undo:  # noqa: BLE001 - both go into the one error
                raise ckpt.RestoreError(f"restoring {cid} failed ({exc}), and removing what it "
                                              f"made failed too: {undo}") from exc
            if isinstance(exc, (ckpt.RestoreError, asyncio.CancelledError, KeyboardInterrupt)):
                raise
            raise ckpt.RestoreError(f"restoring {cid}: {exc}") from exc
        self._live[cid] = rec
        return Started(address=f"http://{rec.ip}:{rec.port}", pid=rec.pid, log_path=self.log_path(cid))

    async def _unpacked(self, tar: Path) -> tuple[Path, dict]:
        """The checkpoint unpacked once per worker and kept (`<state>/unpacked/<tar name>`): the
        images are read in place by every restore of it, so a restore no longer unpacks hundreds of
        MB first. The newest KEEP_UNPACKED stay; a half-unpacked one is never used (rename)."""
        root = self.state_dir / "unpacked"
        if len(tar.name) == 64 and all(ch in "0123456789abcdef" for ch in tar.name):
            final = root / tar.name  # a node-cache blob: named by its sha256 (its mtime moves on use)
        else:  # any other tar: size and mtime tell versions apart
            st = tar.stat()
            final = root / f"{tar.name}-{st.st_size}-{st.st_mtime_ns}"
        if not (final / "manifest.json").exists():
            root.mkdir(parents=True, exist_ok=True)
            staging = root / f".{final.name}.{uuid.uuid4().hex[:8]}"
            try:
                manifest = await asyncio.to_thread(ckpt.unpack, tar, staging)
                ckpt.make_traversable(staging / ckpt.IMAGES)
                (staging / "manifest.json").write_text(json.dumps(manifest))
                try:
                    os.rename(staging, final)
                except OSError:  # unpacked meanwhile by a concurrent restore of the same tar
                    pass
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            for old in sorted((d for d in root.iterdir() if not d.name.startswith(".")),
                              key=lambda d: d.stat().st_mtime, reverse=True)[KEEP_UNPACKED:]:
                shutil.rmtree(old, ignore_errors=True)
        os.utime(final)
        return final, json.loads((final / "manifest.json").read_text())

    async def _restore(self, cid: str, cdir: Path, images: Path, criu: CriuInfo) -> None:
        work = cdir / "restore-work"
        work.mkdir()
        log = cdir / "runc.log"
        # runc joins the netns named in config.json and hands it to CRIU (--inherit-fd
        # fd[N]:extRootNetNS), matching the `net[inode]:extRootNetNS` external of the dump
        failed = await self._criu_job(
            ["--log", str(log), "--log-format", "json", "--criu", str(criu.binary), "restore",
             "--detach", "--image-path", str(images), "--work-path", str(work), "--bundle", str(cdir),
             "--pid-file", str(cdir / "init.pid"), cid],
            work / "restore.log", self.restore_timeout, cid, kill_container=True)
        if failed is not None:
            raise ckpt.RestoreError(
                f"CRIU could not restore {cid}: {failed or _criu_reason(work / 'restore.log', log)}")

    async def _criu_job(self, args: list[str], criu_log: Path, timeout: float, cid: str, *,
                        kill_container: bool) -> str | None:
        """Run `runc <args>` (a checkpoint or restore) under a watchdog; None when it succeeded,
        else "" (read the logs) or why the watchdog killed it.

        Why a watchdog: CRIU 4.2.1 restoring a truncated pages image spins forever in its
        restorer, logging two lines per turn at runc's fixed log level 4 (18 GB in 10 minutes,
        seen here). runc and CRIU run in their own session, so the kill reaches CRIU's helpers;
        for a restore the half-restored tasks in the container's cgroup are killed too."""
        proc = await asyncio.create_subprocess_exec(
            self.runc, "--root", str(self.runc_root), *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True)
        deadline = time.monotonic() + timeout
        why = "cancelled"
        try:
            while True:
                try:
                    rc = await asyncio.wait_for(proc.wait(), 0.05)
                except asyncio.TimeoutError:
                    pass
                else:
                    why = ""
                    return None if rc == 0 else ""
                if time.monotonic() > deadline:
                    why = f"it ran longer than {timeout:.0f} s and was killed"
                    return why
                if _size(criu_log) > self.criu_log_limit:
                    why = f"its log grew past {self.criu_log_limit >> 20} MiB (CRIU looping) and it was killed"
                    return why
        finally:
            if why:  # killed by the watchdog, or we were cancelled: leave nothing running
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                await proc.wait()
                if kill_container:
                    await _kill_cgroup(f"/levers9/{cid}")

    async def _undo_restore(self, cid: str) -> None:
        """Remove every trace of a failed restore: processes, mounts runc and CRIU left (runc's
        criu-root bind mount, CRIU's cgroup yard in its work dir: both stay when CRIU is killed),
        runc state, network, address, files, cgroups."""
        await _kill_cgroup(f"/levers9/{cid}")
        await self._runc_cmd("delete", "-f", cid)
        self._unmount_criu_leftovers(cid)
        shutil.rmtree(self.runc_root / cid, ignore_errors=True)
        await self._teardown(cid, keep_log=False)
        _remove_cgroups(f"/levers9/{cid}")

    def _unmount_criu_leftovers(self, cid: str) -> None:
        """Mounts a killed runc/CRIU leaves: runc's `<runc root>/<id>/criu-root` bind of the root,
        CRIU's cgroup yard `.criu.cgyard.*` in its work dir (deepest first)."""
        for top in (self.container_dir(cid) / "restore-work", self.runc_root / cid):
            for mount_point in sorted(_mounts_under(top), key=len, reverse=True):
                _libc.umount2(mount_point.encode(), MNT_DETACH)  # fails only if already gone

    async def _base_identity(self) -> str:
        """What tells base root file systems apart: the sha256 of their package list."""
        if self._base_id is None:
            await self.prepare()
            assert self._base is not None
            self._base_id = await asyncio.to_thread(ckpt.file_sha256,
                                                    self._base / "var/lib/dpkg/status")
        return self._base_id

    # -- helpers --

    async def _forget_neighbor(self, ip: str) -> None:
        """Drop the host's ARP entry of a reused address: it may still hold the MAC of the
        previous container's veth as REACHABLE (up to ~45 s), and every packet would go to that
        dead MAC until it expires (seen: ~10 s before a new container answered)."""
        await network.ip("neigh", "flush", "to", ip, "dev", self.settings.bridge_name, check=False)

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


def _criu_reason(criu_log: Path, runc_log: Path) -> str:
    """CRIU's own error lines, or runc's when CRIU left no log (it crashed or never ran)."""
    if criu_log.exists():
        return ckpt.criu_error(criu_log)
    return _runc_error(runc_log)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mounts_under(top: Path) -> list[str]:
    prefix = str(top)
    return [m for m in _mount_points() if m == prefix or m.startswith(prefix + "/")]


async def _kill_cgroup(cgroups_path: str, timeout: float = 5) -> None:
    """SIGKILL every process in the container's cgroup until none is left (thawed first: a frozen
    task does not die)."""
    cgroup = memory_cgroup_dir(cgroups_path)
    if cgroup is None or not cgroup.is_dir():
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _thaw(cgroups_path)
        try:
            pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        await asyncio.sleep(0.02)


async def _copy_tree(src: Path, dst: Path) -> None:
    """A copy keeping owners, modes, times, xattrs (overlay opaque dirs), hard links and
    whiteouts (char devices 0:0): `cp -a`, which Python's copytree is not."""
    proc = await asyncio.create_subprocess_exec(
        "cp", "-a", "--reflink=auto", str(src), str(dst), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise ckpt.CheckpointError(f"copying the writable layer {src}: {err.decode().strip()}")


def _thaw(cgroups_path: str) -> None:
    """Thaw the container's cgroup (v1 freezer or v2 cgroup.freeze), if it is frozen."""
    for mount_point, fstype, options in _cgroup_mounts():
        base = Path(mount_point) / cgroups_path.lstrip("/")
        try:
            if fstype == "cgroup" and "freezer" in options.split(","):
                (base / "freezer.state").write_text("THAWED")
            elif fstype == "cgroup2" and (base / "cgroup.freeze").exists():
                (base / "cgroup.freeze").write_text("0")
        except OSError:
            pass


def _cgroup_mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, super options) of every cgroup hierarchy."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _source, options = (right.split() + ["", "", ""])[:3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((left.split()[4], fstype, options))
    return found


def _remove_cgroups(cgroups_path: str) -> None:
    """Remove the (empty) cgroup directories of `cgroups_path` in every hierarchy, if any are left."""
    for mount_point, _, _ in _cgroup_mounts():
        path = Path(mount_point) / cgroups_path.lstrip("/")
        try:
            path.rmdir()
        except OSError:
            pass


async def _run_checked(cmd: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise ckpt.RestoreError(f"{' '.join(cmd[:2])} failed: {err.decode(errors='replace').strip()}")
