#!/usr/bin/env bash
# The main job on a fresh machine: set up, start levers9 (NATS, PostgreSQL, S3 and the six services),
# then a first look: status, a container requested through the REST gateway, and its events.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
L9=.venv/bin/levers9

$L9 up
home="${LEVERS9_HOME:-$HOME/.levers9}"
gateway=$(sed -n 's/^gateway_url = "\(.*\)"/\1/p' "$home/config.toml")
token=$(sed -n 's/^token = "\(.*\)"/\1/p' "$home/config.toml")

echo
echo "== levers9 status --json"
$L9 status --json
echo
echo "== POST $gateway/api/v1/containers (a request, as a developer's tool would send it)"
reply=$(curl -sf -X POST -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
  -d '{"cpu": 0.5, "memory": 256}' "$gateway/api/v1/containers")
echo "$reply"
corr=$(echo "$reply" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["correlation_id"])')
sleep 1
echo
echo "== levers9 events replay --correlation-id $corr"
$L9 events replay --correlation-id "$corr"
echo
echo "levers9 is running. Try: $L9 events tail   |   $L9 status   |   $L9 down"
