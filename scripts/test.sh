#!/usr/bin/env bash
# The whole test suite from a fresh machine: creates .venv, installs kubegpu with its test tools, then runs the
# linters, the type checker, the architecture contracts and pytest. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# strict editable mode: a link tree under build/ that mypy follows like an installed package.
.venv/bin/python -m pip install --quiet -e '.[test]' --config-settings editable_mode=strict

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy (strict on kubegpu.core)"
.venv/bin/mypy -p kubegpu.core -p kubegpu.scheduler -p kubegpu.plugins
echo "== import-linter (layering contracts)"
.venv/bin/lint-imports
echo "== pytest"
.venv/bin/pytest "$@"
