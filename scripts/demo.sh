#!/usr/bin/env bash
# From a fresh machine: creates .venv, installs kubegpu with the locked versions of its dependencies
# (requirements/runtime.txt, every file's hash checked), and runs the simulator on the mixed example cluster.
# `pip install kubegpu` keeps pyproject.toml's version ranges; this command and the test suite use the lock.
set -euo pipefail
cd "$(dirname "$0")/.."

mkdir -p build
{
  python3 -m venv .venv
  .venv/bin/python -m pip install --require-hashes --no-deps -r requirements/runtime.txt
  .venv/bin/python -m pip install --no-deps --no-build-isolation -e .
} > build/setup.log 2>&1 || { cat build/setup.log; echo "setting up .venv failed (see above)"; exit 1; }
.venv/bin/kubegpu simulate "${@:-examples/clusters/mixed.yaml}"
