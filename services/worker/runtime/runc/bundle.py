"""The OCI bundle of a runc container (pure): config.json, the init script, the environment and the
files every container's writable layer starts with.

How the process runs: init (PID 1 of the container) is a small /bin/sh script that points its own
and the app's stdio INTO the container (`/var/log/levers9/container.log`; a host file as an fd
breaks CRIU dumps), starts the app as its child, forwards SIGTERM/SIGINT/SIGHUP to it, and once
the app ended writes its status to `/var/log/levers9/exit-status` and exits with it. runc keeps no
exit status for detached containers, so that file is how poll() learns the status; sh as PID 1 also
reaps orphans. A SIGKILL of the container (stop's last resort, or the OOM killer picking sh) leaves
no file: the status is then unknown (None).
"""

from __future__ import annotations

import os
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from levers9.executor import wire
from levers9.worker.gpus import cdi
from levers9.worker.runtime.interface import ContainerSpec

from . import seccomp

LOG_DIR = "/var/log/levers9"
LOG_FILE = f"{LOG_DIR}/container.log"
EXIT_FILE = f"{LOG_DIR}/exit-status"
CGROUP_PARENT = "/levers9"
CPU_PERIOD_US = 100_000
PIDS_LIMIT = 4096
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CAPABILITIES = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]  # `runc spec`'s default set
MASKED_PATHS = ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi"]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
# what the spec enforces (1: seccomp); a process keeps the seccomp filter it was dumped with, so a
# checkpoint of a container that ran under less is never restored (levers9.worker.runtime.runc.dump_restore)
HARDENING = 1


@dataclass(frozen=True)
class JobSpec(ContainerSpec):
    """A one-off container of tenant code that the worker runs for a sandbox (its `packages=`
    install, where setup.py runs): a sandbox's confinement (its image, runc, capabilities, seccomp,
    a network namespace of its own, no peers), and one way out: its worker's egress proxy
    ("IP:PORT", levers9.worker.network.egress_proxy) to the package indexes."""
    egress_proxy: str = ""


def egress_proxy_of(spec: ContainerSpec) -> str:
    """The egress proxy a container may reach ("" for every workload: only jobs have one)."""
    return spec.egress_proxy if isinstance(spec, JobSpec) else ""


def cgroups_path(container_id: str) -> str:
    """Where a container's cgroups live in every hierarchy (config.json's cgroupsPath)."""
    return f"{CGROUP_PARENT}/{container_id}"


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
           **(spec.gpu.env if spec.gpu else {}), "PATH": PATH, "HOME": "/root"}
    sdk = "/opt/levers9" + (f":{VENDOR_DIR}" if spec.vendor_dir else "")
    env["PYTHONPATH"] = sdk + (f":{spec.env['PYTHONPATH']}" if spec.env.get("PYTHONPATH") else "")
    return [f"{k}={v}" for k, v in env.items()]


def _mounts(spec: ContainerSpec) -> list[dict[str, Any]]:
    bind_ro = ["bind", "ro", "nosuid", "nodev"]
    return [
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
        *_function_mounts(spec),
        # volumes and buckets: FUSE mounts on the host; runc gives CRIU every bind as an external mount
        *({"destination": b.destination, "type": "bind", "source": b.source,
           "options": ["bind", "ro" if b.read_only else "rw", "nosuid", "nodev"]} for b in spec.binds),
    ]


VENDOR_DIR = "/opt/levers9-vendor"
EXECUTOR_DIR = "/run/levers9"  # levers9.executor.wire.SOCKET_DIR
PACKAGES_DIR = "/var/lib/levers9/packages"


def _function_mounts(spec: ContainerSpec) -> list[dict[str, Any]]:
    """A function sandbox's binds: the executor's socket directory (written by the sandbox, read by
    the worker's relay), cloudpickle beside the SDK, and the node's cache of per-sandbox installs."""
    binds = [(spec.vendor_dir, VENDOR_DIR, "ro"), (spec.executor_dir, EXECUTOR_DIR, "rw"),
             (spec.packages_dir, PACKAGES_DIR, "rw")]
    return [{"destination": dest, "type": "bind", "source": str(Path(src).resolve()),
             "options": ["bind", mode, "nosuid", "nodev"]} for src, dest, mode in binds if src is not None]


def _resources(spec: ContainerSpec) -> dict[str, Any]:
    """cgroup limits: memory and memory+swap alike (so the limit is real), a CPU quota (at least the
    kernel's minimum of 1 ms per period), a pids limit, no devices."""
    memory = spec.memory_mib * 1024 * 1024
    return {
        "devices": [{"allow": False, "access": "rwm"}],
        "memory": {"limit": memory, "swap": memory},
        "cpu": {"quota": max(1000, spec.cpu_millicores * CPU_PERIOD_US // 1000), "period": CPU_PERIOD_US},
        "pids": {"limit": PIDS_LIMIT},
    }


def bundle_spec(spec: ContainerSpec, rootfs_path: Path, netns_path: Path, *,
                cgroup_parent: str = CGROUP_PARENT, criu_config: Path | None = None) -> dict[str, Any]:
    """The OCI config.json of a container (runc 1.1, spec 1.0.2).

    No /sys mount (CRIU restores fail with one); the process's stdio is set up inside the
    container by `init_script`; /app and /opt/levers9 are read-only binds of the host's dirs.
    `criu_config`: the CRIU configuration file runc hands to CRIU for this container (annotation
    `org.criu.config`; without it runc would use the machine-wide /etc/criu/runc.conf).
    """
    config: dict[str, Any] = {
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
        "mounts": _mounts(spec),
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                           {"type": "network", "path": str(netns_path)}],
            "cgroupsPath": f"{cgroup_parent}/{spec.container_id}",
            "resources": _resources(spec),
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
            "seccomp": seccomp.profile(CAPABILITIES),  # Docker's default profile (levers9.worker.runtime.runc.seccomp)
        },
    }
    if criu_config is not None:
        config["annotations"] = {"org.criu.config": str(criu_config)}
    if spec.gpu is not None and spec.gpu.cdi_spec is not None:  # runc reads no CDI: its edits applied here
        config = cdi.apply_cdi(config, spec.gpu.cdi_spec, spec.gpu.cdi_devices)
        # nvidia-ctk's spec sets NVIDIA_VISIBLE_DEVICES=void (for the legacy hook runc does not run):
        # the app and levers9.distributed read their cards from it, so ours stays
        config["process"]["env"] = cdi.merge_env(config["process"]["env"], [f"{k}={v}" for k, v in spec.gpu.env.items()])
    return config


def hosts_file(ip: str, hostname: str) -> str:
    return f"127.0.0.1\tlocalhost\n::1\tlocalhost\n{ip}\t{hostname}\n"


def upper_files(spec: ContainerSpec, ip: str) -> dict[str, str]:
    """Files every container gets in its writable layer: the log, and name resolution that needs
    no network (containers have no DNS; a host resolver copied by debootstrap would make every
    lookup, e.g. http.server's getfqdn, hang for seconds)."""
    return {
        LOG_FILE: f"{spec.gpu.note}\n" if spec.gpu and spec.gpu.note else "",  # how it got its GPUs
        "/etc/hosts": hosts_file(ip, spec.container_id[:63]),
        "/etc/resolv.conf": "# levers9: no DNS; containers reach only their bridge subnet\n",
        "/etc/hostname": f"{spec.container_id[:63]}\n",
    }


def spec_record(spec: ContainerSpec) -> dict[str, Any]:
    """The fields of a spec that a checkpoint carries to its restores (host paths are not)."""
    return {"env": dict(spec.env), "cpu_millicores": spec.cpu_millicores,
            "memory_mib": spec.memory_mib, "command": list(spec.command), "port": spec.port,
            # the executor inside a function sandbox: a restore refuses a generation it does not speak
            "executor_generation": wire.GENERATION if spec.executor_dir else 0, "hardening": HARDENING}


def plain_file(upper: Path, path: str) -> bool:
    """Whether `path` (a container path) is a regular file in the writable layer `upper`, reached
    through real directories only. The container writes there: a symlink it planted (its log made a
    link to a host file) would make a host process that reads the path read the host's file."""
    current = upper
    for part in [p for p in path.strip("/").split("/") if p]:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except OSError:
            return False
        if stat.S_ISLNK(mode):
            return False
    return stat.S_ISREG(mode) if current != upper else False


def open_plain(upper: Path, path: str) -> BinaryIO:
    """`path` (a container path) in the writable layer `upper`, opened for reading through real
    directories only (each one opened relative to the last, never following a link), and only if it
    is a regular file: checking with plain_file and then opening would let a running container swap in
    a link between the two. OSError otherwise."""
    parts = [p for p in path.strip("/").split("/") if p]
    if not parts:
        raise IsADirectoryError(path)
    fd = os.open(upper, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            fd, parent = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd), fd
            os.close(parent)
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise OSError(f"{path} is not a regular file")
    os.set_blocking(leaf, True)
    return os.fdopen(leaf, "rb")


def write_upper(upper: Path, files: dict[str, str]) -> None:
    """Write `files` (container paths -> text) into a writable layer."""
    for path, text in files.items():
        target = upper / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
