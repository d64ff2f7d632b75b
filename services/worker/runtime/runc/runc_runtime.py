"""RuncRuntime: each app in a real container (runc, overlay root, own network namespace, cgroup).

Layout of one container, under `<state_dir>/containers/<id>/`:
    config.json  the OCI bundle spec (levers9.worker.runtime.runc.bundle, pure)
    upper/ work/ the overlay's writable layer over the shared base root (levers9.worker.runtime.runc.rootfs)
    rootfs/      the overlay mount (levers9.worker.mounts.syscalls)
    state.json   what stop() and cleanup_all() need after a restart (levers9.worker.runtime.runc.cli.Record)
    spec.json    the spec fields a checkpoint's manifest carries (env, cpu, memory, command, port)
    criu.conf    CRIU's options for this container, named by the `org.criu.config` annotation
    runc.log     runc's own log of `runc run` (or `runc restore`)
runc's state lives in `<state_dir>/runc` (`runc --root`), so workers of one machine never see each
other's containers. After stop() only the log is left, moved to `<state_dir>/logs/<id>.log`.

Built in layers, each its own module: the lifecycle (levers9.worker.runtime.runc.lifecycle: start, poll,
stop, cleanup) and CRIU's checkpoint/restore over it (levers9.worker.runtime.runc.dump_restore); the bundle, the
cgroups, the mounts and the runc command line are plain functions beside them.
"""

from __future__ import annotations

from .dump_restore import RuncCheckpoints


class RuncRuntime(RuncCheckpoints):
    name = "runc"
    features = ["runc"]
