"""The runc runtime: RuncRuntime (runc_runtime) composed of the lifecycle of containers (lifecycle) and their
checkpoint and restore with CRIU (dump_restore); below them plain parts: the OCI bundle (bundle), the runc
command line (cli), cgroups, seccomp, and the shared base root file system (rootfs)."""
