#!/usr/bin/env bash
# The whole test suite from a fresh machine: creates .venv from the lock, installs kubegpu into it, then runs the
# linters, the type checker, the architecture contracts and pytest. `.ci/run` calls exactly this.
#
#   ./scripts/test.sh [PYTEST ARGS]            the locked environment: requirements/test.txt, every file's hash checked
#   ./scripts/test.sh --latest [PYTEST ARGS]   the same suite in .venv-latest, on the newest versions pyproject.toml's
#                                              ranges admit today, with a list of what differs from the lock
#
# The lock (uv.lock, and the two files pip installs from, exported from it) is refreshed only by scripts/lock.sh,
# as a change reviewed like any other.
set -euo pipefail
cd "$(dirname "$0")/.."

LATEST=0
if [[ "${1:-}" == "--latest" ]]; then
  LATEST=1
  shift
fi
mkdir -p build
if [[ "$LATEST" == "1" ]]; then
  VENV=.venv-latest
  echo "== setting up $VENV with the newest versions the ranges admit (log: build/setup-latest.log)"
  {
    python3 -m venv --clear "$VENV"
    "$VENV/bin/python" -m pip install --upgrade pip
    "$VENV/bin/python" -m pip install --upgrade --upgrade-strategy eager -e '.[test]' --config-settings editable_mode=strict
  } > build/setup-latest.log 2>&1 || { cat build/setup-latest.log; echo "setting up $VENV failed (see above)"; exit 1; }
  "$VENV/bin/python" scripts/lock_drift.py requirements/test.txt
else
  VENV=.venv
  # The venv is made anew whenever the lock or pyproject.toml changed since it was made: it holds the locked set and
  # nothing else. pip checks every file against the lock's hashes (--require-hashes) and resolves nothing.
  STAMP="$(cat requirements/test.txt pyproject.toml | sha256sum | cut -c1-16)"
  if [[ "$(cat "$VENV/.kubegpu-lock" 2> /dev/null)" != "$STAMP" ]]; then
    echo "== setting up $VENV from requirements/test.txt (log: build/setup.log)"
    {
      python3 -m venv --clear "$VENV"
      "$VENV/bin/python" -m pip install --require-hashes --no-deps -r requirements/test.txt
      # strict editable mode: a link tree under build/ that mypy follows like an installed package.
      "$VENV/bin/python" -m pip install --no-deps --no-build-isolation -e . --config-settings editable_mode=strict
      "$VENV/bin/python" -m pip check
    } > build/setup.log 2>&1 || { cat build/setup.log; echo "setting up $VENV failed (see above)"; exit 1; }
    echo "$STAMP" > "$VENV/.kubegpu-lock"
  fi
fi

echo "== ruff"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
echo "== mypy (strict on kubegpu.core)"
"$VENV/bin/mypy" -p kubegpu.core -p kubegpu.kube -p kubegpu.scheduler -p kubegpu.plugins -p kubegpu.crishim
echo "== import-linter (layering contracts, run on a plain copy: grimp does not follow link trees)"
rm -rf build/lint-site
"$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation --target build/lint-site . > build/lint.log 2>&1 \
  || { cat build/lint.log; exit 1; }
# import-linter takes the file as an argument from 2.16 on and deprecates --config (the lock for Python 3.10 has 2.15).
LINT_CONFIG=(--config ../../pyproject.toml)
"$VENV/bin/lint-imports" --help | grep -q CONFIG_FILES && LINT_CONFIG=(../../pyproject.toml)
(cd build/lint-site && "../../$VENV/bin/lint-imports" "${LINT_CONFIG[@]}" --no-cache)
# The HTML report's tests open it in headless Chromium and `kubegpu top --watch`'s test drives a tmux pane.
if ! command -v chromium > /dev/null || ! command -v chromedriver > /dev/null || ! command -v tmux > /dev/null; then
  echo "== installing chromium, chromium-driver, tmux (log: build/report-tools.log)"
  SUDO=""; [[ "$(id -u)" -eq 0 ]] || SUDO=sudo
  install_tools() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver tmux; }
  { install_tools || { $SUDO apt-get update -q && install_tools; }; } > build/report-tools.log 2>&1 \
    || { cat build/report-tools.log; echo "installing chromium, chromium-driver and tmux failed (see above)"; exit 1; }
fi
# The deploy tests render examples/deploy/kustomize with kubectl 1.20 (the API server's version): Debian's
# kubernetes-client, extracted into the cache (installing it could clash with another package's /usr/bin/kubectl).
KUBECTL_DIR="${KUBEGPU_K8S_CACHE:-$HOME/.cache/kubegpu}/kubectl-1.20.2"
if [[ ! -x "$KUBECTL_DIR/kubectl" ]]; then
  echo "== extracting Debian's kubernetes-client (kubectl 1.20) to $KUBECTL_DIR (log: build/kubectl.log)"
  mkdir -p "$KUBECTL_DIR" build/kubectl-deb
  { (cd build/kubectl-deb && rm -f ./*.deb && { apt-get download kubernetes-client \
      || { SUDO=""; [[ "$(id -u)" -eq 0 ]] || SUDO=sudo; $SUDO apt-get update -q && apt-get download kubernetes-client; }; }) \
    && dpkg-deb -x build/kubectl-deb/kubernetes-client_*.deb build/kubectl-deb/root \
    && cp build/kubectl-deb/root/usr/bin/kubectl "$KUBECTL_DIR/kubectl"; } > build/kubectl.log 2>&1 \
    || { cat build/kubectl.log; echo "extracting kubectl 1.20 from Debian's kubernetes-client failed (see above)"; exit 1; }
fi
export KUBEGPU_KUBECTL="$KUBECTL_DIR/kubectl"
# Integration tests need a real kube-apiserver and etcd: built once from Debian's sources and cached outside the
# clone (about 7 minutes the first time). KUBEGPU_SKIP_INTEGRATION=1 is the explicit opt-out for quick local runs.
if [[ "${KUBEGPU_SKIP_INTEGRATION:-0}" == "1" ]]; then
  echo "== pytest (integration tests deselected: KUBEGPU_SKIP_INTEGRATION=1)"
  "$VENV/bin/pytest" -m "not integration" "$@"
else
  echo "== real components (kube-apiserver, kube-scheduler, etcd)"
  ./scripts/k8s-binaries.sh | tee build/k8s-binaries.out
  KUBEGPU_K8S_BIN="$(tail -n 1 build/k8s-binaries.out)"
  export KUBEGPU_K8S_BIN
  echo "== real components (containerd, runc, busybox image)"
  ./scripts/containerd-env.sh | tee build/containerd-env.out
  KUBEGPU_BUSYBOX_OCI="$(tail -n 1 build/containerd-env.out)"
  export KUBEGPU_BUSYBOX_OCI
  # The kubegpu image: the Dockerfile built with buildah on an mmdebstrap base (cached; test_image.py runs it).
  echo "== the kubegpu image (mmdebstrap base, buildah build of the Dockerfile)"
  ./scripts/image.sh | tee build/image.out
  KUBEGPU_IMAGE_OCI="$(tail -n 1 build/image.out)"
  export KUBEGPU_IMAGE_OCI
  echo "== pytest"
  "$VENV/bin/pytest" "$@"
fi
