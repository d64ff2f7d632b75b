"""Mounts into containers: volumes and cloud buckets (volumes), and the mount system calls the runtime
and the images use (syscalls)."""
