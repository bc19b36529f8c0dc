#!/usr/bin/env bash
# From a fresh machine: creates .venv, installs kubegpu, and runs the simulator on the mixed example cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

mkdir -p build
{
  python3 -m venv .venv
  .venv/bin/python -m pip install --upgrade pip
  .venv/bin/python -m pip install -e .
} > build/setup.log 2>&1 || { cat build/setup.log; echo "setting up .venv failed (see above)"; exit 1; }
.venv/bin/kubegpu simulate "${@:-examples/clusters/mixed.yaml}"
