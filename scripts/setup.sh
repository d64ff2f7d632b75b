#!/usr/bin/env bash
# Installs what levers9 needs on a fresh Debian 12 machine (as root): Debian packages, a venv in
# .venv, and the project (editable) with its pinned dependencies. Safe to run again.
#   scripts/setup.sh          runtime only
#   scripts/setup.sh --test   plus the test dependencies
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
command -v runc >/dev/null || need_apt+=(runc)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v ip >/dev/null || need_apt+=(iproute2)
command -v useradd >/dev/null || need_apt+=(passwd)
command -v curl >/dev/null || need_apt+=(curl)
# the containers' firewall (levers9.worker.network.firewall): nft, and the kernel's nf_tables
[ -x /usr/sbin/nft ] || need_apt+=(nftables)
# images: buildah builds them, docker-registry serves them, skopeo and umoci pull and unpack them,
# fuse3 (and its headers, for pyfuse3) mounts them lazily on workers
command -v buildah >/dev/null || need_apt+=(buildah)
[ -x /usr/bin/docker-registry ] || need_apt+=(docker-registry)
command -v skopeo >/dev/null || need_apt+=(skopeo)
command -v umoci >/dev/null || need_apt+=(umoci)
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
pkg-config --exists fuse3 2>/dev/null || need_apt+=(libfuse3-dev)
# cloud buckets: s3fs-fuse mounts an S3 bucket per container on the worker
command -v s3fs >/dev/null || need_apt+=(s3fs)
# --test: podman and podman-compose, to run docker-compose.yml (README "docker-compose"); podman,
# not docker.io, whose daemon sets the FORWARD policy to DROP and loads br_netfilter (FACTS)
if [ -n "$extras" ]; then
  command -v podman >/dev/null || need_apt+=(podman)
  command -v podman-compose >/dev/null || need_apt+=(podman-compose)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to install ${need_apt[*]} with apt-get (or install them yourself)" >&2
    exit 1
  fi
  echo "setup: apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

python3 - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"setup: levers9 needs Python >= 3.11, this is {sys.version.split()[0]}")
PY

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
echo "setup: installing levers9${extras} into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras}"
echo "setup: done ($(.venv/bin/levers9 --help >/dev/null && echo 'levers9 CLI ok'))"
