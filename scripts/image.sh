#!/usr/bin/env bash
# Builds the kubegpu image from the repository's Dockerfile without any container registry, and writes it as an OCI
# archive that `ctr -n k8s.io image import`, `podman load` or `skopeo copy` take as it is.
#
#   1. Installs mmdebstrap and buildah when missing (apt-get; needs root and the Debian mirror).
#   2. The base: a minimal Debian bookworm root filesystem (python3, python3-venv, ca-certificates, and libstdc++6 for
#      grpcio's wheels) made with mmdebstrap, cached as an OCI archive under
#      ${KUBEGPU_IMAGE_CACHE:-$HOME/.cache/kubegpu/image} keyed by a hash of its recipe (suite, packages,
#      exclusions): made again only when the recipe changes (about 40 s).
#   3. The image: `buildah bud --layers --network host --build-arg BASE=<that base> -t kubegpu:VERSION .` in a buildah
#      storage of its own under the same cache. The dependencies' layer is keyed by the lock
#      (requirements/runtime.txt) alone, so a change to kubegpu's code rebuilds in seconds. pip inside the build reaches PyPI over the host's network, or the
#      http(s) index this machine's pip is set up with (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST or
#      `pip config`), passed as build arguments, and trusts the CA bundle pip is told to (PIP_CERT or `pip config`
#      cert), mounted into the build only. A local file:// index is not visible inside the build and is left out.
#   4. Exports it as an OCI archive naming the image docker.io/library/kubegpu:VERSION, the name a pod's
#      `image: kubegpu:VERSION` (examples/deploy) resolves to in containerd; skipped when the archive holds it already.
#
# Cold about 1.5 minutes, warm under 10 s (20 s after a code change). The last line printed on success is the
# archive's path. Verbose output goes to $CACHE/image.log. Runs of it on one machine take turns (a lock in the cache).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE_DIR="${KUBEGPU_IMAGE_CACHE:-$HOME/.cache/kubegpu/image}"
LOG="$CACHE_DIR/image.log"
SUITE=bookworm
# usr-is-merged satisfies init-system-helpers' `usrmerge | usr-is-merged` (mmdebstrap merges /usr itself); usrmerge
# and the perl it pulls in are purged afterwards (about 50 MB).
BASE_PACKAGES=(python3 python3-venv ca-certificates libstdc++6 usr-is-merged)
BASE_PURGE=(usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl libperl5.36 perl-modules-5.36)
BASE_EXCLUDE=('/usr/share/doc/*' '/usr/share/man/*' '/usr/share/locale/*' '/usr/share/info/*')
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)"
IMAGE_NAME="${KUBEGPU_IMAGE_NAME:-docker.io/library/kubegpu:${VERSION:-latest}}"
BUILD_TAG="localhost/kubegpu:${VERSION:-latest}"
IMAGE_OCI="$CACHE_DIR/kubegpu-oci.tar"

log() { echo "== image: $*"; }

die() {
  echo "image: FAILED: $*" >&2
  if [[ -s "$LOG" ]]; then
    echo "---- last 40 lines of $LOG ----" >&2
    tail -n 40 "$LOG" >&2
    echo "---- end of log ----" >&2
  fi
  exit 1
}

# run_logged "what failed" cmd args...: the command's output goes to $LOG.
run_logged() {
  local what="$1"
  shift
  echo "+ $*" >> "$LOG"
  "$@" >> "$LOG" 2>&1 || die "$what (command: $*)"
}

as_root() {
  if [[ "$(id -u)" -eq 0 ]]; then "$@"; elif command -v sudo > /dev/null; then sudo "$@"; else
    die "root (or sudo) is needed to run: $*"
  fi
}

mkdir -p "$CACHE_DIR"
# One run at a time per cache (another clone's tests may be building): wait for the lock.
exec 9> "$CACHE_DIR/.lock"
flock 9
: > "$LOG"
START=$SECONDS

# -- 1. tools -------------------------------------------------------------------------------------------------------
missing=()
command -v mmdebstrap > /dev/null || missing+=(mmdebstrap)
command -v buildah > /dev/null || missing+=(buildah)
if [[ ${#missing[@]} -gt 0 ]]; then
  log "installing ${missing[*]} (apt-get; log: $LOG)"
  install_tools() {
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  }
  echo "+ apt-get install ${missing[*]}" >> "$LOG"
  { install_tools || { as_root apt-get update -q && install_tools; }; } >> "$LOG" 2>&1 \
    || die "could not install ${missing[*]} with apt-get (is the Debian mirror reachable?)"
fi
command -v mmdebstrap > /dev/null && command -v buildah > /dev/null || die "mmdebstrap or buildah missing after apt-get"
log "$(mmdebstrap --version 2>&1 | head -n 1), $(buildah --version 2>&1 | head -n 1)"

# buildah with a storage of its own under the cache (no system state touched; `rm -rf $CACHE_DIR` forgets it all).
# overlay where the kernel has it, vfs (slower, larger) otherwise.
STORAGE_DRIVER="${KUBEGPU_BUILDAH_STORAGE_DRIVER:-$(grep -qw overlay /proc/filesystems && echo overlay || echo vfs)}"
bh() { buildah --root "$CACHE_DIR/storage" --runroot "$CACHE_DIR/run" --storage-driver "$STORAGE_DRIVER" "$@"; }

# -- 2. the base ----------------------------------------------------------------------------------------------------
# (layout=N: the version of the OCI wrapping below, so that a change to it makes the base again.)
RECIPE="layout=3 suite=$SUITE variant=essential include=${BASE_PACKAGES[*]} purge=${BASE_PURGE[*]} exclude=${BASE_EXCLUDE[*]}"
KEY="$(printf '%s' "$RECIPE" | sha256sum | cut -c1-16)"
BASE_OCI="$CACHE_DIR/base-$SUITE-$KEY-oci.tar"
BASE_REF="localhost/kubegpu-base:$SUITE-$KEY"

if [[ ! -s "$BASE_OCI" ]]; then
  log "making the $SUITE base with mmdebstrap: ${BASE_PACKAGES[*]} (recipe $KEY; about a minute)"
  ROOTFS="$CACHE_DIR/base-$KEY.rootfs.tar"
  hooks=(--customize-hook="chroot \"\$1\" dpkg --purge ${BASE_PURGE[*]}"
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*')
  dpkgopts=()
  for pattern in "${BASE_EXCLUDE[@]}"; do dpkgopts+=(--dpkgopt="path-exclude=$pattern"); done
  include="$(IFS=,; echo "${BASE_PACKAGES[*]}")"
  run_logged "mmdebstrap could not make the $SUITE base (Debian mirror reachable? enough space in ${TMPDIR:-/tmp}?)" \
    env SOURCE_DATE_EPOCH=0 mmdebstrap --variant=essential --include="$include" "${dpkgopts[@]}" "${hooks[@]}" \
    "$SUITE" "$ROOTFS"
  # One uncompressed layer (the root filesystem tar as mmdebstrap wrote it) in an OCI image layout tar.
  run_logged "could not wrap $ROOTFS as an OCI archive" python3 - "$ROOTFS" "$BASE_OCI.tmp" "$BASE_REF" << 'EOF'
import hashlib, io, json, os, platform, sys, tarfile

rootfs, out, name = sys.argv[1:]
arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
sha = hashlib.sha256()
with open(rootfs, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        sha.update(chunk)
layer = "sha256:" + sha.hexdigest()
size = os.path.getsize(rootfs)
config = json.dumps({
    "architecture": arch, "os": "linux", "created": "1970-01-01T00:00:00Z",
    "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "mmdebstrap (scripts/image.sh)"}],
    "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
               "Cmd": ["/usr/bin/python3"]},
    "rootfs": {"type": "layers", "diff_ids": [layer]},
}, sort_keys=True).encode()
def digest(data): return "sha256:" + hashlib.sha256(data).hexdigest()
manifest = json.dumps({
    "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config), "size": len(config)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": size}],
}, sort_keys=True).encode()
index = json.dumps({"schemaVersion": 2, "manifests": [{
    "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(manifest), "size": len(manifest),
    "annotations": {"org.opencontainers.image.ref.name": name}}]}, sort_keys=True).encode()
def entry(path, size=0, kind=tarfile.REGTYPE, mode=0o644):
    info = tarfile.TarInfo(path)
    info.type, info.size, info.mode, info.mtime = kind, size, mode, 0
    return info
with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as archive:
    archive.addfile(entry("blobs", kind=tarfile.DIRTYPE, mode=0o755))
    archive.addfile(entry("blobs/sha256", kind=tarfile.DIRTYPE, mode=0o755))
    for path, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index),
                       ("blobs/sha256/" + digest(config)[7:], config), ("blobs/sha256/" + digest(manifest)[7:], manifest)]:
        archive.addfile(entry(path, len(data)), io.BytesIO(data))
    with open(rootfs, "rb") as f:
        archive.addfile(entry("blobs/sha256/" + layer[7:], size), f)
EOF
  rm -f "$ROOTFS"
  mv -f "$BASE_OCI.tmp" "$BASE_OCI"
  log "base cached: $BASE_OCI ($(du -m "$BASE_OCI" | cut -f1) MiB, $((SECONDS - START)) s)"
else
  log "cached base: $BASE_OCI"
fi
# Older bases (another recipe) are of no further use.
find "$CACHE_DIR" -maxdepth 1 -name "base-$SUITE-*-oci.tar" ! -name "$(basename "$BASE_OCI")" -delete

if ! bh inspect --type image "$BASE_REF" > /dev/null 2>&1; then
  log "importing the base into buildah's storage as $BASE_REF"
  echo "+ buildah pull oci-archive:$BASE_OCI" >> "$LOG"
  base_id="$(bh pull --quiet "oci-archive:$BASE_OCI" 2>> "$LOG" | tail -n 1)" || die "buildah could not import $BASE_OCI"
  run_logged "buildah could not tag the base" bh tag "$base_id" "$BASE_REF"
fi

# Bases of other recipes left in the storage.
for stale in $(bh images --format '{{.Name}}:{{.Tag}}' 2> /dev/null | grep '^localhost/kubegpu-base:' || true); do
  [[ "$stale" == "$BASE_REF" ]] || bh rmi "$stale" >> "$LOG" 2>&1 || true
done

# -- 3. the image ---------------------------------------------------------------------------------------------------
# pip's index settings as this machine's pip sees them: the environment first, then `pip config` (install.*, global.*).
pip_setting() {
  local env_name="$1" key="$2" value="${!1:-}"
  if [[ -z "$value" ]] && command -v python3 > /dev/null; then
    value="$(python3 -m pip config list 2> /dev/null | sed -n "s/^install\.$key='\(.*\)'$/\1/p" | head -n 1)"
    [[ -n "$value" ]] || value="$(python3 -m pip config list 2> /dev/null | sed -n "s/^global\.$key='\(.*\)'$/\1/p" | head -n 1)"
  fi
  # Only network indexes: a file:// index or a local path is not visible inside the build.
  local kept=() url
  for url in $value; do
    case "$url" in
      http://* | https://*) kept+=("$url") ;;
      *) [[ "$key" == trusted-host ]] && kept+=("$url") || echo "  (pip $key $url is local to this machine: not passed to the build)" >> "$LOG" ;;
    esac
  done
  echo "${kept[*]}"
}
pip_args=()
for pair in PIP_INDEX_URL:index-url PIP_EXTRA_INDEX_URL:extra-index-url PIP_TRUSTED_HOST:trusted-host; do
  value="$(pip_setting "${pair%%:*}" "${pair#*:}")"
  if [[ -n "$value" ]]; then
    pip_args+=(--build-arg "${pair%%:*}=$value")
    log "pip ${pair#*:} for the build: $value"
  fi
done

# A CA bundle pip is told to trust (a TLS-inspecting proxy's, say): bind-mounted into the build's RUN steps only.
pip_cert="${PIP_CERT:-}"
if [[ -z "$pip_cert" ]]; then
  pip_cert="$(python3 -m pip config list 2> /dev/null | sed -n "s/^\(install\|global\)\.cert='\(.*\)'$/\2/p" | head -n 1)"
fi
if [[ -n "$pip_cert" && -f "$pip_cert" ]]; then
  pip_args+=(--volume "$(readlink -f "$pip_cert"):/run/kubegpu-build/pip-cert.pem:ro" --build-arg PIP_CERT=/run/kubegpu-build/pip-cert.pem)
  log "pip cert for the build: $pip_cert"
fi

previous_id="$(bh images --quiet --no-trunc "$BUILD_TAG" 2> /dev/null | head -n 1 || true)"
log "building $BUILD_TAG from Dockerfile (buildah bud --layers --network host; log: $LOG)"
BUILD_START=$SECONDS
run_logged "buildah could not build the Dockerfile (PyPI reachable? see the log)" \
  bh bud --layers --network host --isolation "${KUBEGPU_BUILDAH_ISOLATION:-oci}" --build-arg "BASE=$BASE_REF" \
  "${pip_args[@]}" --tag "$BUILD_TAG" --file Dockerfile .
image_id="$(bh images --quiet --no-trunc "$BUILD_TAG" | head -n 1)"
log "built $BUILD_TAG ${image_id#sha256:} in $((SECONDS - BUILD_START)) s"
if [[ -n "$previous_id" && "$previous_id" != "$image_id" ]]; then
  # The previous build's image is untagged now; its layers would only pile up.
  bh rmi "$previous_id" >> "$LOG" 2>&1 || true
fi

# Build-stage layers of earlier locks are no longer used but stay (each about 250 MB): past a bound,
# drop every untagged image (the next build then installs the dependencies again, about a minute).
if [[ "$(du -sm "$CACHE_DIR/storage" 2> /dev/null | cut -f1)" -gt "${KUBEGPU_IMAGE_STORAGE_MAX_MB:-4096}" ]]; then
  log "buildah storage above ${KUBEGPU_IMAGE_STORAGE_MAX_MB:-4096} MiB: removing untagged images"
  bh rmi --prune >> "$LOG" 2>&1 || true
fi

# -- 4. the archive -------------------------------------------------------------------------------------------------
if [[ -s "$IMAGE_OCI" && "$(cat "$IMAGE_OCI.id" 2> /dev/null)" == "$image_id $IMAGE_NAME" ]]; then
  log "archive up to date: $IMAGE_OCI"
else
  rm -f "$IMAGE_OCI.tmp"
  run_logged "buildah could not export the image" bh push --quiet "$image_id" "oci-archive:$IMAGE_OCI.tmp:$IMAGE_NAME"
  mv -f "$IMAGE_OCI.tmp" "$IMAGE_OCI"
  echo "$image_id $IMAGE_NAME" > "$IMAGE_OCI.id"
  log "exported $IMAGE_NAME to $IMAGE_OCI"
fi
log "image $IMAGE_NAME: $IMAGE_OCI ($(du -m "$IMAGE_OCI" | cut -f1) MiB compressed; $((SECONDS - START)) s in all)"
echo "$IMAGE_OCI"
