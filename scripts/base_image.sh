#!/usr/bin/env bash
# The base images of levers9's container image, made on this machine (no registry needed): Debian 12
# (bookworm, minbase) from debootstrap, with python3.11 + venv and every Debian tool a levers9
# process uses (runc and criu for the worker, buildah/skopeo/umoci for image builds, docker-registry,
# fuse3, nftables, iproute2), committed with buildah under local names:
#   localhost/levers9-base:bookworm-build   the same plus a compiler and headers (pyfuse3 has no wheel)
#   localhost/levers9-base:bookworm         without them (the build's packages purged, one layer)
#
#   scripts/base_image.sh            makes them unless they exist (then it takes a second)
#   scripts/base_image.sh --force    makes them again
#   LEVERS9_BASE_IMAGE=NAME          another local name (NAME and NAME-build)
#
# Then scripts/build_image.sh builds the Dockerfile on them (its BASE and BUILD_BASE default to these
# names; a team with a registry says --build-arg BASE=python:3.11-slim-bookworm
# --build-arg BUILD_BASE=python:3.11-bookworm instead).
#
# The Debian mirror is this machine's own (its apt sources), never a name written here; the image's
# /etc/apt/sources.list is then set to deb.debian.org, so nothing of this machine stays in it.
set -euo pipefail

name=${LEVERS9_BASE_IMAGE:-localhost/levers9-base:bookworm}
force=0
[ "${1:-}" = "--force" ] && force=1

if [ "$(id -u)" -ne 0 ]; then
  echo "base_image: needs root (debootstrap, buildah)" >&2
  exit 1
fi
for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || { echo "base_image: $tool is missing (apt-get install $tool)" >&2; exit 1; }
done

build_name=$name-build
if [ $force -eq 0 ] && buildah inspect --type image "$name" >/dev/null 2>&1 \
    && buildah inspect --type image "$build_name" >/dev/null 2>&1; then
  echo "base_image: $name and $build_name exist"
  exit 0
fi

# the first source of this machine serving bookworm/main (apt's own view of its sources)
mirror=$(apt-cache policy 2>/dev/null | awk '$3 == "bookworm/main" && $4 == "amd64" && $5 == "Packages" {print $2; exit}')
if [ -z "$mirror" ]; then
  echo "base_image: no apt source of this machine serves 'bookworm main' (apt-get update first?)" >&2
  exit 1
fi

packages=(
  python3 python3-venv ca-certificates
  # the worker: runc containers, their network and firewall, checkpoints, lazy image mounts, volumes
  runc criu iproute2 nftables iptables fuse3 procps
  # image builds (the build pool) and the registry; containernetworking-plugins named because
  # debootstrap cannot pick a provider of buildah's virtual dependency (container-network-stack)
  buildah containernetworking-plugins skopeo umoci docker-registry debootstrap
)
# only in the build image: what compiles the Python packages that come as sources (pyfuse3)
build_packages=(gcc libc6-dev python3-dev pkg-config libfuse3-dev libselinux1-dev)  # (libselinux-dev: virtual)
# (not s3fs: it depends on the virtual `fuse`, and debootstrap then takes fuse 2, which fuse3 breaks)

started=$(date +%s)
ctr=$(buildah from scratch)
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
root=$(buildah mount "$ctr")
echo "base_image: debootstrap bookworm into $ctr (a few minutes)"
# the .debs are kept between runs (a --force rebuild downloads nothing again)
debs=/var/cache/levers9/base-image-debs
mkdir -p "$debs"
if ! debootstrap --variant=minbase --cache-dir="$debs" --include="$(IFS=,; echo "${packages[*]} ${build_packages[*]}")" \
    bookworm "$root" "$mirror" > "$debs/debootstrap.out" 2>&1; then
  tail -20 "$debs/debootstrap.out" >&2
  grep -h -B1 -A2 "is not installed" "$root/debootstrap/debootstrap.log" 2>/dev/null | grep -v "configuring anyway" | tail -12 >&2 || true
  echo "base_image: debootstrap failed" >&2
  exit 1
fi

# nothing of this machine in the image: its mirror, resolver, host name
echo "deb http://deb.debian.org/debian bookworm main" > "$root/etc/apt/sources.list"
: > "$root/etc/resolv.conf"
echo "levers9" > "$root/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' > "$root/etc/hosts"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
  "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
buildah umount "$ctr" >/dev/null

buildah config --env LANG=C.UTF-8 --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --cmd '["python3"]' --label org.opencontainers.image.title=levers9-base \
  --label org.opencontainers.image.description="Debian 12 + python3.11, made by scripts/base_image.sh" "$ctr"
buildah commit -q --rm "$ctr" "$build_name" >/dev/null
trap - EXIT

# the runtime base: the build image less what only builds need. Every package is marked automatic
# but the required ones, apt and the runtime list, so autoremove takes the compiler and the headers
# with all they pulled in; squashed, so the purged files are in no layer.
ctr=$(buildah from --pull=never "$build_name")
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
buildah run --network none "$ctr" sh -ec "
  apt-mark auto \$(dpkg-query -W -f '\${Package}\n') >/dev/null
  apt-mark manual apt ${packages[*]} \$(dpkg-query -W -f '\${Package} \${Priority}\n' | awk '\$2 == \"required\" {print \$1}') >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get autoremove --purge -y -q >/dev/null
  rm -rf /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log"
buildah commit -q --squash --rm "$ctr" "$name" >/dev/null
trap - EXIT
echo "base_image: $name and $build_name made in $(( $(date +%s) - started )) s"
