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
# the dashboard's web app is built with Node and npm (Next.js 16 needs Node >= 20.9; see the build below)
command -v node >/dev/null || need_apt+=(nodejs)
command -v npm >/dev/null || need_apt+=(npm)
if [ -n "$extras" ]; then
  command -v podman >/dev/null || need_apt+=(podman)
  command -v podman-compose >/dev/null || need_apt+=(podman-compose)
  # tests/browser drive Debian's chromium with Playwright (its own browser download cannot work here)
  [ -x /usr/bin/chromium ] || need_apt+=(chromium)
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
# The dashboard's web app (services/dashboard/web, a Next.js static export that levers9.dashboard serves
# from web/out/): built when out/ is missing or its sources changed since (a hash of them in out/).
# npm reaches only its registry (package-lock.json pins every package); Next's telemetry is off.
web=services/dashboard/web
web_sources() {  # the files git would track there (build output is ignored), as one hash
  (cd "$web" && git ls-files -z --cached --others --exclude-standard . | LC_ALL=C sort -z | xargs -0 sha256sum \
    | sha256sum | cut -d' ' -f1)
}
web_hash=$(web_sources)
if [ "$(cat "$web/out/.sources.sha256" 2>/dev/null)" != "$web_hash" ]; then
  if ! node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 9) ? 0 : 1)'; then
    echo "setup: the dashboard's web app needs Node >= 20.9 (this is $(node --version)); not built, the dashboard serves placeholder pages" >&2
  else
    echo "setup: building the dashboard's web app (npm ci && npm run build in $web)"
    (cd "$web" && export NEXT_TELEMETRY_DISABLED=1 && npm ci --no-audit --no-fund --loglevel=error >/dev/null \
      && npm run build >/dev/null)
    echo "$web_hash" > "$web/out/.sources.sha256"
  fi
fi

echo "setup: done ($(.venv/bin/levers9 --help >/dev/null && echo 'levers9 CLI ok'))"
