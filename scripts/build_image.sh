#!/usr/bin/env bash
# Builds levers9's image (the Dockerfile) on this machine, without any registry:
#   scripts/build_image.sh [TAG]      default TAG: levers9:local; extra buildah bud arguments after it
# 1. the local base image (scripts/base_image.sh; skipped when it exists);
# 2. buildah bud --pull=never --layers: unchanged steps come from the layer cache (the dependencies'
#    layer is rebuilt only when pyproject.toml changes).
# pip inside the build reaches the package index the way this machine's pip does: its settings
# (`pip config list`, the PIP_* environment included) are written to a pip.conf mounted at /etc/pip.conf
# for the build's RUN steps only, with the files and folders they name (CA bundle, constraints,
# find-links, the folders of file:// indexes) mounted read-only at the same paths. Nothing of it stays in the image.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-levers9:local}
shift || true

bash scripts/base_image.sh

conf=$(mktemp -d /tmp/levers9-pipconf.XXXXXX)
trap 'rm -rf "$conf"' EXIT
mounts=$(python3 - "$conf/pip.conf" <<'PY'
import configparser, os, subprocess, sys
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
settings = {}
for line in out.splitlines():
    key, _, value = line.partition("=")
    section, _, name = key.partition(".")
    if name:  # global.cert='…', :env:.cert='…' (the environment wins, as in pip)
        if section == ":env:" or name not in settings:
            settings[name] = value.strip().strip("'\"")
parser = configparser.ConfigParser()
parser["global"] = settings
with open(sys.argv[1], "w") as f:
    parser.write(f)
paths = set()
for name in ("cert", "client-cert", "constraint", "requirement", "find-links", "extra-index-url", "index-url"):
    for item in settings.get(name, "").split():
        path = item.removeprefix("file://").rstrip("/")
        if name.endswith("index-url") and path.endswith("/simple"):
            path = os.path.dirname(path)  # a file:// index's pages link to files beside `simple/`
        if path.startswith("/") and os.path.exists(path):
            paths.add(path)
print("\n".join(sorted(paths)))
PY
)
args=(-v "$conf/pip.conf:/etc/pip.conf:ro")
while IFS= read -r path; do
  [ -n "$path" ] && args+=(-v "$path:$path:ro")
done <<< "$mounts"

started=$(date +%s)
buildah bud --pull=never --layers --format docker "${args[@]}" -t "$tag" "$@" .
echo "build_image: $tag built in $(( $(date +%s) - started )) s"
