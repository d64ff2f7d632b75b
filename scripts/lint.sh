#!/usr/bin/env bash
# Lint and types, run by scripts/test.sh before the tests: ruff on the whole tree, the size limits
# (modules <= 500 lines, functions <= 60 lines outside tests/ and bench/), and mypy on the whole
# levers9 package (libs, every service, the SDK and CLI).
#
# mypy cannot follow setuptools' package-dir mapping (levers9.scheduler -> services/scheduler), so
# it checks a tree of symlinks that lays the folders out under their import names.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python

echo "lint: ruff"
.venv/bin/ruff check .
echo "lint: sizes"
$py scripts/check_sizes.py
echo "lint: mypy"
tree=.typecheck/levers9
rm -rf .typecheck && mkdir -p "$tree"
for f in sdk/levers9/*.py; do ln -s "$PWD/$f" "$tree/$(basename "$f")"; done
for d in sdk/levers9/*/; do [ -f "$d/__init__.py" ] && ln -s "$PWD/$d" "$tree/$(basename "$d")"; done
ln -s "$PWD/libs/contracts" "$tree/contracts"
ln -s "$PWD/libs/runtime" "$tree/runtime"
for d in services/*/; do
  name=$(basename "$d" | tr - _)
  ln -s "$PWD/$d" "$tree/$name"
done
(cd .typecheck && MYPYPATH=. ../.venv/bin/mypy --config-file ../pyproject.toml --cache-dir ../.mypy_cache \
  -p levers9)
