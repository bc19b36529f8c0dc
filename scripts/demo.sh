#!/usr/bin/env bash
# From a fresh machine: creates .venv, installs kubegpu, and runs the simulator on the mixed example cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
.venv/bin/kubegpu simulate "${@:-examples/clusters/mixed.yaml}"
