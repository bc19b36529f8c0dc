#!/usr/bin/env bash
# The whole test suite from a fresh machine: creates .venv, installs kubegpu with its test tools, then runs the
# linters, the type checker, the architecture contracts and pytest. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== setting up .venv (log: build/setup.log)"
mkdir -p build
{
  python3 -m venv .venv
  .venv/bin/python -m pip install --upgrade pip
  # strict editable mode: a link tree under build/ that mypy follows like an installed package.
  .venv/bin/python -m pip install -e '.[test]' --config-settings editable_mode=strict
} > build/setup.log 2>&1 || { cat build/setup.log; echo "setting up .venv failed (see above)"; exit 1; }

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy (strict on kubegpu.core)"
.venv/bin/mypy -p kubegpu.core -p kubegpu.kube -p kubegpu.scheduler -p kubegpu.plugins -p kubegpu.crishim
echo "== import-linter (layering contracts, run on a plain copy: grimp does not follow link trees)"
rm -rf build/lint-site
.venv/bin/python -m pip install --quiet --no-deps --no-build-isolation --target build/lint-site . > build/lint.log 2>&1 \
  || { cat build/lint.log; exit 1; }
(cd build/lint-site && ../../.venv/bin/lint-imports --config ../../pyproject.toml --no-cache)
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
  .venv/bin/pytest -m "not integration" "$@"
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
  .venv/bin/pytest "$@"
fi
