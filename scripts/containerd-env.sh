#!/usr/bin/env bash
# Prepares what the CRI shim's integration tests and benchmark run against: Debian's containerd (1.6) and runc, the CNI
# plugins (Debian's containernetworking-plugins, under /usr/lib/cni: the kubelet tests' node is Ready only with a CNI
# config), and a tiny busybox image. No image can be pulled here, so the image is built locally: one layer holding Debian's static
# busybox (`busybox-static`) and its applet links, written as an OCI image layout tar that the test harness imports
# with `ctr -n k8s.io image import` into its own containerd (tests/integration/containerd.py). The same image serves as
# the pod sandbox ("pause") image and as the containers' image.
#
# Missing packages are installed with apt-get (needs root and the Debian mirror; `apt-get update` runs first). The tar
# goes to ${KUBEGPU_CONTAINERD_CACHE:-$HOME/.cache/kubegpu/containerd}/busybox-oci.tar and is rebuilt on every run (it
# takes well under a second); the last line printed on success is its path.
set -euo pipefail

CACHE_DIR="${KUBEGPU_CONTAINERD_CACHE:-$HOME/.cache/kubegpu/containerd}"
IMAGE_TAR="$CACHE_DIR/busybox-oci.tar"
IMAGE_NAME="${KUBEGPU_BUSYBOX_IMAGE_NAME:-docker.io/kubegpu/busybox:1}"
LOG="$CACHE_DIR/containerd-env.log"

log() { echo "== containerd-env: $*"; }

die() {
  echo "containerd-env: FAILED: $*" >&2
  if [[ -s "$LOG" ]]; then
    echo "---- last 30 lines of $LOG ----" >&2
    tail -n 30 "$LOG" >&2
    echo "---- end of log ----" >&2
  fi
  exit 1
}

as_root() {
  if [[ "$(id -u)" -eq 0 ]]; then "$@"; elif command -v sudo > /dev/null; then sudo "$@"; else
    die "root (or sudo) is needed to run: $*"
  fi
}

# apt-get install without starting services: the tests start their own containerd, and a system one started by the
# package's init script would only compete for the machine.
apt_install() {
  local made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    as_root sh -c 'printf "#!/bin/sh\nexit 101\n" > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d'
    made_policy=1
  fi
  local rc=0
  {
    echo "+ apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update
    echo "+ apt-get install -y --no-install-recommends $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
  } >> "$LOG" 2>&1 || rc=$?
  if [[ $made_policy -eq 1 ]]; then as_root rm -f /usr/sbin/policy-rc.d; fi
  [[ $rc -eq 0 ]] || die "could not install Debian packages: $* (is the Debian mirror reachable?)"
}

mkdir -p "$CACHE_DIR"
: > "$LOG"

# The busybox the image needs is the static one: the image has no libc.
static_busybox() {
  local candidate
  for candidate in /bin/busybox /usr/bin/busybox; do
    [[ -x "$candidate" ]] || continue
    if LC_ALL=C file -L "$candidate" 2> /dev/null | grep -q 'statically linked' \
      || ! LC_ALL=C ldd "$candidate" > /dev/null 2>&1; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

missing=()
command -v containerd > /dev/null || missing+=(containerd)
command -v ctr > /dev/null || missing+=(containerd)
command -v runc > /dev/null || missing+=(runc)
static_busybox > /dev/null || missing+=(busybox-static)
# The kubelet tests need a CNI config for the node to turn Ready (their pods use the host network).
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
  || missing+=(containernetworking-plugins)
if [[ ${#missing[@]} -gt 0 ]]; then
  # shellcheck disable=SC2207
  missing=($(printf '%s\n' "${missing[@]}" | sort -u))
  log "installing ${missing[*]} (apt-get; log: $LOG)"
  apt_install "${missing[@]}"
fi
for binary in containerd ctr runc; do
  command -v "$binary" > /dev/null || die "$binary is not on PATH after installing containerd and runc"
done
BUSYBOX="$(static_busybox)" || die "no statically linked busybox after installing busybox-static"
log "containerd: $(containerd --version 2>&1 | head -n 1)"
log "runc: $(runc --version 2>&1 | head -n 1)"
log "busybox: $BUSYBOX"

case "$(uname -m)" in
  x86_64) ARCH=amd64 ;;
  aarch64) ARCH=arm64 ;;
  *) ARCH="$(uname -m)" ;;
esac

# The OCI image layout (oci-layout, index.json, blobs/sha256/...) as a tar, written with Python's tarfile so that the
# layer is reproducible (fixed owners and times). Applet links are symlinks to /bin/busybox.
python3 - "$BUSYBOX" "$IMAGE_TAR.tmp" "$IMAGE_NAME" "$ARCH" << 'EOF'
import hashlib, io, json, sys, tarfile

busybox, out, name, arch = sys.argv[1:]
APPLETS = ["sh", "ls", "env", "cat", "sleep", "true", "echo", "stat", "id", "mkdir", "test"]

def entry(path, kind, **extra):
    info = tarfile.TarInfo(path)
    info.type, info.mtime, info.uid, info.gid = kind, 0, 0, 0
    for k, v in extra.items():
        setattr(info, k, v)
    return info

layer_buffer = io.BytesIO()
with tarfile.open(fileobj=layer_buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
    for directory in ["bin", "dev", "etc", "proc", "sys", "tmp", "root"]:
        layer.addfile(entry(directory, tarfile.DIRTYPE, mode=0o1777 if directory == "tmp" else 0o755))
    data = open(busybox, "rb").read()
    layer.addfile(entry("bin/busybox", tarfile.REGTYPE, mode=0o755, size=len(data)), io.BytesIO(data))
    for applet in APPLETS:
        layer.addfile(entry(f"bin/{applet}", tarfile.SYMTYPE, linkname="busybox", mode=0o777))
    passwd = b"root:x:0:0:root:/root:/bin/sh\n"
    layer.addfile(entry("etc/passwd", tarfile.REGTYPE, mode=0o644, size=len(passwd)), io.BytesIO(passwd))
layer_bytes = layer_buffer.getvalue()

def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()

config = json.dumps({
    "architecture": arch,
    "os": "linux",
    # The sandbox ("pause") container runs the default command: it only has to stay alive.
    "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sleep", "2147483647"], "WorkingDir": "/"},
    "rootfs": {"type": "layers", "diff_ids": [digest(layer_bytes)]},
}, sort_keys=True).encode()
manifest = json.dumps({
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config), "size": len(config)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest(layer_bytes),
                "size": len(layer_bytes)}],
}, sort_keys=True).encode()
index = json.dumps({
    "schemaVersion": 2,
    "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digest(manifest),
        "size": len(manifest),
        "platform": {"architecture": arch, "os": "linux"},
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]},
    }],
}, sort_keys=True).encode()

with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as archive:
    def add(path, data):
        archive.addfile(entry(path, tarfile.REGTYPE, mode=0o644, size=len(data)), io.BytesIO(data))
    archive.addfile(entry("blobs", tarfile.DIRTYPE, mode=0o755))
    archive.addfile(entry("blobs/sha256", tarfile.DIRTYPE, mode=0o755))
    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    add("index.json", index)
    for blob in (layer_bytes, config, manifest):
        add("blobs/sha256/" + digest(blob).split(":", 1)[1], blob)
EOF
mv -f "$IMAGE_TAR.tmp" "$IMAGE_TAR"
log "image $IMAGE_NAME: $IMAGE_TAR ($(du -k "$IMAGE_TAR" | cut -f1) KiB)"
echo "$IMAGE_TAR"
