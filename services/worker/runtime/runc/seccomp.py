"""The containers' seccomp filter (pure): Docker's default profile, rendered for an OCI config.json.

What Docker (moby, profiles/seccomp/default.json) allows by default, as an allow list over a default
of EPERM: the ordinary system calls of a process (files, sockets, memory, signals, time, threads);
`socket` for every family but AF_VSOCK; `personality` only for the harmless personas; `clone` only
without namespace flags and `clone3` answered ENOSYS (so libc falls back to `clone`, whose flags a
filter can see); system calls a capability grants (mount, unshare, setns, bpf, ptrace of others'
memory, reboot, module loading, clock setting, ...) only when the container holds that capability.
Our containers hold none of those (levers9.worker.runtime.runc.bundle.CAPABILITIES), so none are allowed here.

Two deliberate differences: io_uring is not allowed (as in Docker 25 and later: its operations
bypass this filter entirely), and neither are ptrace and process_vm_readv/writev without
CAP_SYS_PTRACE (Docker allows them on kernels >= 4.8): a handler has no use for tracing its
container's other processes (the init, the runner), and CRIU traces from the host, not from inside.

runc resolves the names with libseccomp and skips the ones this kernel's table lacks, so one list
serves old and new kernels. `profile(capabilities, machine)` is the `linux.seccomp` object.
"""

from __future__ import annotations

import platform
from typing import Any

# every architecture's common calls (the 32-bit and time64 names matter to 32-bit x86 processes)
ALLOWED = """
accept accept4 access adjtimex alarm bind brk capget capset chdir chmod chown chown32 clock_adjtime
clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep
clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2 dup3 epoll_create
epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2
execve execveat exit exit_group faccessat faccessat2 fadvise64 fadvise64_64 fallocate fanotify_mark
fchdir fchmod fchmodat fchown fchown32 fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork
fremovexattr fsetxattr fstat fstat64 fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futex
futex_time64 futex_waitv futimesat getcpu getcwd getdents getdents64 getegid getegid32 geteuid geteuid32
getgid getgid32 getgroups getgroups32 getitimer getpeername getpgid getpgrp getpid getppid getpriority
getrandom getresgid getresgid32 getresuid getresuid32 getrlimit get_robust_list getrusage getsid
getsockname getsockopt get_thread_area gettid gettimeofday getuid getuid32 getxattr inotify_add_watch
inotify_init inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy io_getevents io_pgetevents
io_pgetevents_time64 ioprio_get ioprio_set io_setup io_submit ipc kill landlock_add_rule
landlock_create_ruleset landlock_restrict_self lchown lchown32 lgetxattr link linkat listen listxattr
llistxattr _llseek lremovexattr lseek lsetxattr lstat lstat64 madvise membarrier memfd_create memfd_secret
mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap mmap2 mprotect mq_getsetattr mq_notify
mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink mremap msgctl
msgget msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep newfstatat _newselect
open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect poll
ppoll ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease pselect6 pselect6_time64
pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64
recvmsg remap_file_pages removexattr rename renameat renameat2 restart_syscall rmdir rseq rt_sigaction
rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait
rt_sigtimedwait_time64 rt_tgsigqueueinfo sched_getaffinity sched_getattr sched_getparam
sched_get_priority_max sched_get_priority_min sched_getscheduler sched_rr_get_interval
sched_rr_get_interval_time64 sched_setaffinity sched_setattr sched_setparam sched_setscheduler
sched_yield seccomp select semctl semget semop semtimedop semtimedop_time64 send sendfile sendfile64
sendmmsg sendmsg sendto setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups setgroups32
setitimer setpgid setpriority setregid setregid32 setresgid setresgid32 setresuid setresuid32 setreuid
setreuid32 setrlimit set_robust_list setsid setsockopt set_thread_area set_tid_address setuid setuid32
setxattr shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask sigreturn
socketcall socketpair splice stat stat64 statfs statfs64 statx symlink symlinkat sync sync_file_range
syncfs sysinfo tee tgkill time timer_create timer_delete timer_getoverrun timer_gettime timer_gettime64
timer_settime timer_settime64 timerfd_create timerfd_gettime timerfd_gettime64 timerfd_settime
timerfd_settime64 times tkill truncate truncate64 ugetrlimit umask uname unlink unlinkat utime utimensat
utimensat_time64 utimes vfork vmsplice wait4 waitid waitpid write writev
""".split()

# per machine: the libseccomp architectures a filter covers, and that machine's own extra calls
ARCHES = {
    "x86_64": (["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"], ["arch_prctl", "modify_ldt"]),
    "aarch64": (["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
                ["arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint", "cacheflush",
                 "set_tls"]),
}

# system calls a capability grants (Docker's profile adds them when the container holds it)
BY_CAPABILITY = {
    "CAP_SYS_ADMIN": ["bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick",
                      "lookup_dcookie", "mount", "mount_setattr", "move_mount", "open_tree", "perf_event_open",
                      "quotactl", "quotactl_fd", "setdomainname", "sethostname", "setns", "syslog", "umount",
                      "umount2", "unshare"],
    "CAP_DAC_READ_SEARCH": ["open_by_handle_at"],
    "CAP_SYS_BOOT": ["reboot"],
    "CAP_SYS_CHROOT": ["chroot"],
    "CAP_SYS_MODULE": ["delete_module", "init_module", "finit_module"],
    "CAP_SYS_PACCT": ["acct"],
    "CAP_SYS_PTRACE": ["kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev", "ptrace"],
    "CAP_SYS_RAWIO": ["iopl", "ioperm"],
    "CAP_SYS_TIME": ["settimeofday", "stime", "clock_settime", "clock_settime64"],
    "CAP_SYS_TTY_CONFIG": ["vhangup"],
    "CAP_SYS_NICE": ["get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"],
    "CAP_SYSLOG": ["syslog"],
    "CAP_BPF": ["bpf"],
    "CAP_PERFMON": ["perf_event_open"],
}

EPERM, ENOSYS = 1, 38
AF_VSOCK = 40
# clone flags that make namespaces (CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET)
NAMESPACE_FLAGS = 0x7E020000
# personality(2) values that change nothing dangerous: PER_LINUX, PER_LINUX32, UNAME26 variants, query
SAFE_PERSONAS = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)


def _allow(names: list[str], args: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"names": names, "action": "SCMP_ACT_ALLOW"}
    if args:
        rule["args"] = args
    return rule


def profile(capabilities: list[str], machine: str | None = None) -> dict[str, Any]:
    """The `linux.seccomp` of a container holding `capabilities` on `machine` (uname -m)."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise ValueError(f"no seccomp profile for machine {machine!r} (known: {', '.join(sorted(ARCHES))})")
    arches, own = ARCHES[machine]
    held = set(capabilities)
    granted = sorted({name for cap, names in BY_CAPABILITY.items() if cap in held for name in names})
    rules = [_allow(sorted(set(ALLOWED) | set(own))),
             _allow(["socket"], [{"index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_NE"}]),
             *(_allow(["personality"], [{"index": 0, "value": v, "op": "SCMP_CMP_EQ"}]) for v in SAFE_PERSONAS)]
    if "CAP_SYS_ADMIN" not in held:
        rules.append(_allow(["clone"], [{"index": 0, "value": NAMESPACE_FLAGS, "valueTwo": 0,
                                         "op": "SCMP_CMP_MASKED_EQ"}]))
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    if granted:
        rules.append(_allow(granted))
    return {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": EPERM, "architectures": arches,
            "syscalls": rules}
