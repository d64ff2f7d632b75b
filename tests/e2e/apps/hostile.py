"""A hostile handler: from inside its container it tries to get out, and reports what worked.

`POST /endpoint/hostile {"targets": ["IP:PORT", ...], "memory_mib": N, "pids_limit": N}` answers
{"succeeded": [what got through], "results": {probe: outcome}, "controls": {...}}. Every probe that
could disturb the runner (namespaces, keyrings, memory) runs in a forked child. The controls show the
probes themselves work: a listener on the container's own loopback must answer, a child that
allocates well under the limit must live, threads well under the pids limit must start.
"""
import ctypes
import json
import os
import platform
import signal
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from levers9 import App

app = App("hostile")
libc = ctypes.CDLL(None, use_errno=True)
# syscall numbers of the calls Python does not wrap
NR = {"x86_64": {"unshare": 272, "keyctl": 250, "ptrace": 101},
      "aarch64": {"unshare": 97, "keyctl": 219, "ptrace": 117}}[platform.machine()]
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS = 0x10000000, 0x40000000, 0x00020000
KEYCTL_JOIN_SESSION_KEYRING, PTRACE_ATTACH, PTRACE_TRACEME = 1, 16, 0
PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_SYS_ADMIN = 47, 2, 21
ALLOWED_CAPS = (1 << 29) | (1 << 5) | (1 << 10)  # CAP_AUDIT_WRITE, CAP_KILL, CAP_NET_BIND_SERVICE


def connect(target: str) -> str:
    host, port = target.rsplit(":", 1)
    host = host.strip("[]")
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect((host, int(port)))
        return "connected"
    except OSError as exc:
        return type(exc).__name__
    finally:
        s.close()


def in_child(probe) -> str:
    """Run `probe` (returns True when the attack worked) in a forked child: 'worked' or how it failed."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if probe() else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return {0: "worked", 1: "refused", 2: "raised"}.get(os.WEXITSTATUS(status), "?")


def syscall_ok(*args) -> bool:
    return libc.syscall(*args) == 0


def mount_tmpfs() -> bool:
    return libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0


def raw_socket(family, kind, proto) -> str:
    try:
        socket.socket(family, kind, proto).close()
        return "worked"
    except OSError as exc:
        return type(exc).__name__


def open_for_write(path: str) -> str:
    """Open without writing a byte: read-only and missing both refuse the open itself."""
    try:
        os.close(os.open(path, os.O_WRONLY))
        return "worked"
    except OSError as exc:
        return type(exc).__name__


def read_masked(path: str) -> str:
    try:
        if os.path.isdir(path):
            return "worked" if os.listdir(path) else "empty"
        with open(path, "rb") as f:
            return "worked" if f.read(4096) else "empty"
    except OSError as exc:
        return type(exc).__name__


def status_fields() -> dict:
    with open("/proc/self/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def threads_until_refused(cap: int) -> int:
    """Start threads until the kernel refuses one (or `cap` run); how many ran."""
    stop = threading.Event()
    started = []
    threading.stack_size(64 * 1024)
    try:
        while len(started) < cap:
            t = threading.Thread(target=stop.wait, daemon=True)
            try:
                t.start()
            except RuntimeError:
                break
            started.append(t)
    finally:
        stop.set()
        for t in started:
            t.join()
        threading.stack_size(0)
    return len(started)


def allocate(mib: int) -> bool:
    blocks = [bytearray(16 << 20) for _ in range(max(1, mib // 16))]
    return len(blocks) > 0


def listener_control() -> str:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    try:
        return connect(f"127.0.0.1:{srv.getsockname()[1]}")
    finally:
        srv.close()


@app.endpoint(cpu=0.5, memory="512Mi", keep_warm_seconds=120, timeout=120)
def hostile(targets: list = None, memory_mib: int = 512, pids_limit: int = 4096):  # noqa: RUF013
    targets = list(targets or [])
    with ThreadPoolExecutor(32) as pool:
        tcp = dict(zip(targets, pool.map(connect, targets)))
    results = {f"tcp {t}": r for t, r in tcp.items()}
    st = status_fields()
    results.update({
        "mount tmpfs": in_child(mount_tmpfs),
        "unshare user namespace": in_child(lambda: syscall_ok(NR["unshare"], CLONE_NEWUSER)),
        "unshare net+mount namespaces": in_child(lambda: syscall_ok(NR["unshare"], CLONE_NEWNET | CLONE_NEWNS)),
        "keyctl join session keyring": in_child(lambda: libc.syscall(NR["keyctl"], KEYCTL_JOIN_SESSION_KEYRING, None) >= 0),
        "ptrace attach pid 1": in_child(lambda: syscall_ok(NR["ptrace"], PTRACE_ATTACH, 1, 0, 0)),
        "ptrace traceme": in_child(lambda: syscall_ok(NR["ptrace"], PTRACE_TRACEME, 0, 0, 0)),
        "raise CAP_SYS_ADMIN (ambient)": in_child(lambda: libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE,
                                                                       CAP_SYS_ADMIN, 0, 0) == 0),
        "setresuid (needs CAP_SETUID)": in_child(lambda: os.setresuid(1000, 1000, 1000) is None),
        "raw socket (ICMP)": raw_socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
        "packet socket": raw_socket(socket.AF_PACKET, socket.SOCK_RAW, 0),
        "write /proc/sys/kernel/domainname": open_for_write("/proc/sys/kernel/domainname"),
        "write /proc/sys/net/ipv4/ip_forward": open_for_write("/proc/sys/net/ipv4/ip_forward"),
        "write /proc/sysrq-trigger": open_for_write("/proc/sysrq-trigger"),
        "write /sys/kernel/uevent_helper": open_for_write("/sys/kernel/uevent_helper"),
        "write /sys/fs/cgroup": open_for_write("/sys/fs/cgroup/cgroup.procs"),
        "capabilities beyond the default set": "worked" if int(st["CapEff"], 16) & ~ALLOWED_CAPS or
        int(st["CapBnd"], 16) & ~ALLOWED_CAPS else "refused",
        "no_new_privs off": "refused" if st.get("NoNewPrivs") == "1" else "worked",
        "seccomp off": "refused" if st.get("Seccomp") == "2" else "worked",
    })
    for path in ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/acpi", "/proc/scsi"):
        results[f"read {path}"] = read_masked(path)
    ran = threads_until_refused(pids_limit + 64)
    results["threads past the pids limit"] = "worked" if ran >= pids_limit else f"refused after {ran}"
    results["allocate past the memory limit"] = in_child(lambda: allocate(memory_mib + 128))
    controls = {"own loopback": listener_control(), "threads under the limit": threads_until_refused(64),
                "allocate under the limit": in_child(lambda: allocate(32)),
                "ordinary syscall in a child": in_child(lambda: os.getpid() > 0)}
    return json.loads(json.dumps({"succeeded": sorted(k for k, v in results.items() if v in ("worked", "connected")),
                                  "results": results, "controls": controls}))
