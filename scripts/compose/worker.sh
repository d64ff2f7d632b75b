#!/bin/sh
# The worker of docker-compose.yml: `sh /compose/worker.sh service worker` (mounted read-only at /compose).
# LEVERS9_HOST_ADDRESS is where the gateway reaches this worker's containers (their ports are
# DNATed from it inside this container's network namespace), and the worker takes an IPv4 address
# only. Compose gives the container an address of its network only at start, so a name there
# (`worker`, the service's own) is resolved here to this container's address first.
set -eu
address=${LEVERS9_HOST_ADDRESS:-}
case "$address" in
  ''|*[!0-9.]*)
    LEVERS9_HOST_ADDRESS=$(python - "$address" <<'PY'
import socket, sys, time

name = sys.argv[1] or socket.gethostname()
for _ in range(50):  # the network's DNS may answer a moment after the container starts
    try:
        print(socket.gethostbyname(name))
        break
    except OSError:
        time.sleep(0.2)
else:
    print(socket.gethostbyname(socket.gethostname()))  # the container's own, from /etc/hosts
PY
)
    export LEVERS9_HOST_ADDRESS
    echo "worker.sh: LEVERS9_HOST_ADDRESS=$LEVERS9_HOST_ADDRESS (${address:-this container})" >&2
    ;;
esac
exec levers9 "$@"
