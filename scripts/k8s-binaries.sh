#!/usr/bin/env bash
# Builds the real kube-apiserver, kube-scheduler and kubelet (1.20.2) from Debian's `kubernetes` source package and
# installs Debian's etcd-server, for the tests that run against real components. The Kubernetes binaries are cached
# OUTSIDE the repository clone, in ${KUBEGPU_K8S_CACHE:-$HOME/.cache/kubegpu/k8s-1.20.2}; a later run that finds
# working binaries there returns at once, and a cache holding only some of them (an older cache without the kubelet)
# gets only the missing ones built. The first build takes about 11 minutes on 2 cores (the kubelet alone about 5) and
# needs root (apt-get) and access to the Debian package mirror. The last line printed on success is the cache
# directory. See scripts/k8s-README.md for how to start etcd and kube-apiserver from it.
set -euo pipefail

CACHE_DIR="${KUBEGPU_K8S_CACHE:-$HOME/.cache/kubegpu/k8s-1.20.2}"
CACHE_PARENT="$(dirname "$CACHE_DIR")"
LOG="$CACHE_PARENT/k8s-build.log"
BINARIES=(kube-apiserver kube-scheduler kubelet)
DEB_SRC_FILE=/etc/apt/sources.list.d/kubegpu-deb-src.sources

log() { echo "== k8s-binaries: $*"; }

die() {
  echo "k8s-binaries: FAILED: $*" >&2
  if [[ -s "$LOG" ]]; then
    echo "---- last 40 lines of $LOG ----" >&2
    tail -n 40 "$LOG" >&2
    echo "---- end of log ----" >&2
  fi
  exit 1
}

# run_logged "what is missing if this fails" cmd args...: runs the command with its output appended to $LOG.
run_logged() {
  local what="$1"
  shift
  echo "+ $*" >> "$LOG"
  "$@" >> "$LOG" 2>&1 || die "$what (command: $*)"
}

# How the binaries are built; a cached binary built by an older recipe is built again. 2: the vendored
# github.com/modern-go/reflect2 1.0.1 replaced by Debian's 1.0.2 (1.0.1 breaks on Go 1.18+ map internals:
# kube-apiserver built with Debian's Go 1.19 died with SIGSEGV on the first write of any custom resource).
RECIPE=2

cached_one() {
  [[ -x "$CACHE_DIR/$1" ]] && "$CACHE_DIR/$1" --version > /dev/null 2>&1 \
    && [[ "$(cat "$CACHE_DIR/$1.recipe" 2> /dev/null)" == "$RECIPE" ]]
}

cached_ok() {
  local b
  for b in "${BINARIES[@]}"; do
    cached_one "$b" || return 1
  done
}

as_root() {
  if [[ "$(id -u)" -eq 0 ]]; then "$@"; elif command -v sudo > /dev/null; then sudo "$@"; else
    die "root (or sudo) is needed to run: $*"
  fi
}

# etcd from Debian's etcd-server (3.4), unless some etcd is on PATH already.
ensure_etcd() {
  if ! command -v etcd > /dev/null; then
    log "installing etcd-server (apt-get)"
    apt_install etcd-server
  fi
  command -v etcd > /dev/null || die "etcd is not on PATH after installing etcd-server"
  log "etcd: $(command -v etcd) ($(etcd --version 2>/dev/null | head -n 1))"
}

# apt-get install without starting any service (etcd-server would otherwise start a system etcd on :2379 where an
# init system is present).
apt_install() {
  local made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    as_root sh -c 'printf "#!/bin/sh\nexit 101\n" > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d'
    made_policy=1
  fi
  local rc=0
  echo "+ apt-get install -y --no-install-recommends $*" >> "$LOG"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >> "$LOG" 2>&1 || rc=$?
  if [[ $made_policy -eq 1 ]]; then as_root rm -f /usr/sbin/policy-rc.d; fi
  [[ $rc -eq 0 ]] || die "could not install Debian packages: $* (is the Debian mirror reachable? try apt-get update)"
}

# Writes a deb822 file with a `deb-src` copy of every enabled Debian `deb` entry (from sources.list, *.list and
# *.sources), so that `apt-get source kubernetes` works. Skipped when source indexes are already there.
ensure_deb_src() {
  if apt-cache showsrc kubernetes 2> /dev/null | grep -q '^Package: kubernetes'; then
    return 0
  fi
  log "adding deb-src entries ($DEB_SRC_FILE) and running apt-get update"
  local tmp
  tmp="$(mktemp)"
  {
    local f
    # one-line format: "deb [opts] URI suite components..."
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [[ -f "$f" ]] || continue
      awk '$1 == "deb" && /debian/ {
             uri = ""; suites = ""; comps = ""; i = 2
             if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
             uri = $i; suite = $(i + 1); comps = ""
             for (j = i + 2; j <= NF; j++) comps = comps (comps == "" ? "" : " ") $j
             printf "Types: deb-src\nURIs: %s\nSuites: %s\nComponents: %s\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n", uri, suite, comps
           }' "$f"
    done
    # deb822 format: copy each stanza whose Types include deb and whose URIs mention debian, as Types: deb-src.
    for f in /etc/apt/sources.list.d/*.sources; do
      [[ -f "$f" && "$f" != "$DEB_SRC_FILE" ]] || continue
      awk 'BEGIN { RS = ""; FS = "\n" }
           {
             types = ""; uris = ""; enabled = 1
             for (i = 1; i <= NF; i++) {
               if ($i ~ /^Types:/) types = $i
               if ($i ~ /^URIs:/) uris = $i
               if ($i ~ /^Enabled:[ \t]*no/) enabled = 0
             }
             if (!enabled || types !~ /(^|[ \t])deb([ \t]|$)/ || uris !~ /debian/) next
             for (i = 1; i <= NF; i++) {
               if ($i ~ /^#/) continue
               if ($i ~ /^Types:/) print "Types: deb-src"; else print $i
             }
             print ""
           }' "$f"
    done
  } > "$tmp"
  [[ -s "$tmp" ]] || { rm -f "$tmp"; die "found no enabled Debian 'deb' entry in /etc/apt/sources.list* to copy as deb-src"; }
  cat "$tmp" >> "$LOG"
  as_root install -m 644 "$tmp" "$DEB_SRC_FILE"
  rm -f "$tmp"
  run_logged "apt-get update failed after adding $DEB_SRC_FILE (is the Debian mirror reachable?)" as_root apt-get update
  apt-cache showsrc kubernetes 2> /dev/null | grep -q '^Package: kubernetes' \
    || die "the Debian source package 'kubernetes' is not known to apt even with deb-src entries"
}

mkdir -p "$CACHE_PARENT"

if cached_ok; then
  for b in "${BINARIES[@]}"; do
    log "cached $b: $("$CACHE_DIR/$b" --version 2>&1 | head -n 1)"
  done
  command -v etcd > /dev/null || ensure_etcd
  echo "$CACHE_DIR"
  exit 0
fi

: > "$LOG"
MISSING=()
for b in "${BINARIES[@]}"; do
  cached_one "$b" || MISSING+=("$b")
done
log "missing from $CACHE_DIR: ${MISSING[*]}; building them (about 4-5 minutes each on 2 cores; verbose log: $LOG)"
START=$SECONDS

WORK="$(mktemp -d "$CACHE_PARENT/k8s-build.XXXXXX")"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

ensure_deb_src

missing=()
for pkg in golang-go rsync jq dpkg-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2> /dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  log "installing build tools: ${missing[*]}"
  apt_install "${missing[@]}"
fi
GO=/usr/lib/go/bin/go
[[ -x $GO ]] || GO="$(command -v go || true)"
[[ -n "$GO" ]] || die "no Go toolchain after installing golang-go"
log "go: $("$GO" version)"

log "downloading Debian source package 'kubernetes' (apt-get source)"
(cd "$WORK" && run_logged "apt-get source kubernetes failed (deb-src entry, mirror or dpkg-dev missing?)" \
  apt-get source kubernetes)
SRC="$(find "$WORK" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -n 1)"
[[ -n "$SRC" && -f "$SRC/Makefile" ]] || die "apt-get source kubernetes did not unpack a source tree with a Makefile in $WORK"
PKG_VERSION="$(cd "$SRC" && dpkg-parsechangelog -S Version 2> /dev/null || basename "$SRC")"
# 1.20.5+really1.20.2-1 -> 1.20.2 (the upstream code Debian actually ships)
UPSTREAM="$(echo "$PKG_VERSION" | sed -e 's/^[0-9]*://' -e 's/.*really//' -e 's/-[^-]*$//' -e 's/^kubernetes-//')"
log "source: $(basename "$SRC") (Debian version $PKG_VERSION, upstream $UPSTREAM)"

# The source tarball has no .git. Its hack/lib/version.sh carries git-archive values (tag v1.20.2), but pin the
# version from the package name anyway so `--version` reports the upstream release whatever the tarball holds.
# (gitCommit then shows the tarball's default from component-base/version/base.go.)
MAJOR="${UPSTREAM%%.*}"
MINOR="$(echo "$UPSTREAM" | cut -d. -f2)"
cat > "$WORK/version-vars" << EOF
KUBE_GIT_COMMIT=''
KUBE_GIT_TREE_STATE='clean'
KUBE_GIT_VERSION='v$UPSTREAM'
KUBE_GIT_MAJOR='$MAJOR'
KUBE_GIT_MINOR='$MINOR'
EOF

# reflect2 1.0.1, vendored by Kubernetes 1.20, reads Go's map internals as they were before Go 1.18; Debian's
# golang-github-modern-go-reflect2-dev (1.0.2, same API) replaces its files. go.mod and vendor/modules.txt keep
# naming v1.0.1, which is all `go build -mod=vendor` compares.
VENDORED="$SRC/vendor/github.com/modern-go/reflect2"
if grep -Eq '^# github.com/modern-go/reflect2 v1\.0\.1( |$)' "$SRC/vendor/modules.txt"; then
  log "replacing the vendored reflect2 1.0.1 with Debian's golang-github-modern-go-reflect2-dev"
  (cd "$WORK" && run_logged "apt-get download golang-github-modern-go-reflect2-dev failed (mirror reachable?)" \
    apt-get download golang-github-modern-go-reflect2-dev)
  run_logged "unpacking golang-github-modern-go-reflect2-dev failed" \
    dpkg-deb -x "$(ls "$WORK"/golang-github-modern-go-reflect2-dev_*.deb)" "$WORK/reflect2-deb"
  FIXED="$WORK/reflect2-deb/usr/share/gocode/src/github.com/modern-go/reflect2"
  [[ -f "$FIXED/reflect2.go" ]] || die "golang-github-modern-go-reflect2-dev holds no reflect2.go under $FIXED"
  rm -f "$VENDORED"/*.go "$VENDORED"/*.s
  cp "$FIXED"/*.go "$VENDORED"/
  cp "$FIXED"/*.s "$VENDORED"/ 2> /dev/null || true
  rm -f "$VENDORED"/*_test.go
fi

WHAT="$(printf 'cmd/%s ' "${MISSING[@]}")"
WHAT="${WHAT% }"
log "building ${MISSING[*]} (make WHAT=\"$WHAT\", CGO_ENABLED=0)"
mkdir -p "$WORK/home"
(cd "$SRC" && run_logged "make WHAT=\"$WHAT\" failed (see the log tail above)" \
  env HOME="$WORK/home" GOCACHE="$WORK/home/go-cache" GOPATH="$WORK/home/go" CGO_ENABLED=0 \
  PATH="$(dirname "$GO"):$PATH" KUBE_GIT_VERSION_FILE="$WORK/version-vars" \
  make WHAT="$WHAT")

OUT="$SRC/_output/local/bin/linux/amd64"
mkdir -p "$CACHE_DIR"
for b in "${MISSING[@]}"; do
  [[ -x "$OUT/$b" ]] || die "the build finished but $OUT/$b is missing"
  install -m 755 "$OUT/$b" "$CACHE_DIR/$b.tmp"
  mv -f "$CACHE_DIR/$b.tmp" "$CACHE_DIR/$b"
  echo "$RECIPE" > "$CACHE_DIR/$b.recipe"
done
for b in "${BINARIES[@]}"; do
  v="$("$CACHE_DIR/$b" --version 2>&1 | head -n 1)" || die "$CACHE_DIR/$b --version failed: $v"
  log "built $b: $v"
done
echo "$PKG_VERSION" > "$CACHE_DIR/DEBIAN_SOURCE_VERSION"
log "build took $((SECONDS - START)) s"

ensure_etcd
echo "$CACHE_DIR"
