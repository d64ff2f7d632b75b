#!/usr/bin/env bash
# The main job on a fresh machine: set up, start levers9 (NATS, PostgreSQL, S3 and the six services),
# then a first look: status, the hello endpoint deployed and called through the REST gateway (it
# runs in a runc container), the containers and the events of that call.
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
echo "== levers9 deploy examples/hello.py"
$L9 deploy examples/hello.py
echo
echo "== POST $gateway/endpoint/hello (the first call starts a runc container)"
curl -sf -X POST -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
  -d '{"name": "levers9"}' "$gateway/endpoint/hello"
echo
echo
echo "== levers9 containers list"
$L9 containers list
echo
echo "== levers9 events replay --aggregate container (what happened)"
$L9 events replay --aggregate container | tail -n 12
echo
echo "levers9 is running. Try: $L9 events tail   |   $L9 status   |   $L9 down"
