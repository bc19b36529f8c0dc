#!/usr/bin/env bash
# Refreshes the lock the test suite and the image install from, as a change to review like any other:
#
#   ./scripts/lock.sh              re-resolve after a change to pyproject.toml (locked versions kept where they fit)
#   ./scripts/lock.sh --upgrade    every package to the newest version pyproject.toml's ranges admit
#   ./scripts/lock.sh --upgrade-package rich    one package (and what it needs) to its newest
#
# Writes uv.lock (one resolution for every Python and platform kubegpu supports) and, exported from it, the two files
# pip installs from with every file's hash checked: requirements/test.txt (kubegpu's dependencies and the test extra:
# scripts/test.sh) and requirements/runtime.txt (the dependencies and the build tools: the Dockerfile). Then run
# ./scripts/test.sh, and commit the three files with the figures. uv is only the resolver here, pinned below and
# installed into build/uv-venv; installing needs nothing but pip.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
UV=build/uv-venv/bin/uv
if [[ ! -x "$UV" ]] || [[ "$("$UV" --version 2> /dev/null)" != "uv $UV_VERSION"* ]]; then
  python3 -m venv --clear build/uv-venv
  build/uv-venv/bin/python -m pip install --quiet "uv==$UV_VERSION"
fi
# PyPI only, whatever index this machine's uv or pip configuration names: the lock records where each file comes from.
export UV_NO_CONFIG=1 UV_INDEX_URL=https://pypi.org/simple
"$UV" lock "$@"
mkdir -p requirements
"$UV" export --quiet --frozen --no-emit-project --no-header --extra test --format requirements.txt \
  -o requirements/test.txt
"$UV" export --quiet --frozen --no-emit-project --no-header --no-dev --group build --format requirements.txt \
  -o requirements/runtime.txt
git --no-pager diff --stat -- uv.lock requirements/ 2> /dev/null || true
