#!/usr/bin/env bash
# Builds the local control-plane binaries from their Go modules (through the Go module proxy) into
# a cache directory keyed by the pinned versions, so a second run builds nothing.
#
#   tools/cluster/build.sh                     build what is missing, print the bin dir last
#   tools/cluster/build.sh --print-dir         print the bin dir only (builds nothing)
#   tools/cluster/build.sh --print-node-dir    print the real node's bin dir only (builds nothing)
#   tools/cluster/build.sh --print-kuberay-dir print the dir holding KubeRay's crd/ and samples/
#   tools/cluster/build.sh --check             exit 1 unless every binary is present
#
# Environment:
#   KAI_RAY_CACHE          cache root (default ~/.cache/kai-ray)
#   KAI_RAY_BIN_DIR        use control-plane binaries you already have in this directory
#   KAI_RAY_NODE_BIN_DIR   use real-node binaries you already have in this directory
#   KAI_RAY_KUBERAY_DIR    use this KubeRay assets dir (crd/, samples/) instead of the module's
#
# Binaries: kube-apiserver kube-controller-manager kube-scheduler kubectl (k8s wrapper module),
# etcd (etcd wrapper module), ray-operator (kuberay wrapper module), kwok and helm
# (go install module@version: their go.mod files have no replace directives).
# The real node's (kai_ray/testing/realnode.py), in a cache dir of their own keyed by
# versions.env, node/versions.env and the node module: kubelet, kube-proxy and
# gpu-device-plugin (node wrapper module), coredns and crictl (go install module@version).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=node/versions.env
source "$here/node/versions.env"

BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok ray-operator helm)
NODE_BINARIES=(kubelet kube-proxy gpu-device-plugin coredns crictl)
KUBERAY_MODULE=github.com/ray-project/kuberay/ray-operator
cache_root="${KAI_RAY_CACHE:-$HOME/.cache/kai-ray}"

mode=build
case "${1:-}" in
  "") ;;
  --print-dir) mode=print-dir ;;
  --print-node-dir) mode=print-node-dir ;;
  --print-kuberay-dir) mode=print-kuberay-dir ;;
  --check) mode=check ;;
  -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
  *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

# The key covers everything that decides the bytes of a binary: pinned versions, the wrapper
# modules (go.mod, go.sum, mains) and the Go toolchain. Edits to this script do not rebuild.
cache_key() {
  {
    cat "$here/versions.env"
    go env GOVERSION
    (cd "$here" && find k8s etcd kuberay -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) \
      | LC_ALL=C sort | xargs sha256sum)
  } | sha256sum | cut -c1-12
}

# The real node's binaries: a key of their own, so node changes never rebuild the control plane.
node_cache_key() {
  {
    cat "$here/versions.env" "$here/node/versions.env"
    go env GOVERSION
    (cd "$here" && find node -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) \
      | LC_ALL=C sort | xargs sha256sum)
  } | sha256sum | cut -c1-12
}

# The wrapper modules pin the same versions in their go.mod; refuse to build if they drifted.
check_pins() {
  local pin
  for pin in "k8s/go.mod:k8s.io/kubernetes $K8S_VERSION" \
             "node/go.mod:k8s.io/kubernetes $K8S_VERSION" \
             "etcd/go.mod:go.etcd.io/etcd/server/v3 $ETCD_VERSION" \
             "kuberay/go.mod:$KUBERAY_MODULE $KUBERAY_VERSION"; do
    if ! grep -q "${pin#*:}" "$here/${pin%%:*}"; then
      echo "build.sh: $here/${pin%%:*} does not pin ${pin#*:} (versions.env)" >&2
      exit 1
    fi
  done
}

if [ -n "${KAI_RAY_BIN_DIR:-}" ]; then
  bin_dir="$KAI_RAY_BIN_DIR"
else
  if ! command -v go >/dev/null; then
    echo "build.sh: Go is needed to build the control plane (or set KAI_RAY_BIN_DIR)" >&2
    exit 1
  fi
  bin_dir="$cache_root/bin/k8s-$K8S_VERSION-$(cache_key)"
fi
if [ -n "${KAI_RAY_NODE_BIN_DIR:-}" ]; then
  node_dir="$KAI_RAY_NODE_BIN_DIR"
elif command -v go >/dev/null; then
  node_dir="$cache_root/bin/node-$K8S_VERSION-$(node_cache_key)"
else
  node_dir=""  # no Go: the real node cannot be built (the control plane may still be given)
fi
kuberay_dir="${KAI_RAY_KUBERAY_DIR:-$cache_root/kuberay/$KUBERAY_VERSION}"

missing=()
for b in "${BINARIES[@]}"; do [ -x "$bin_dir/$b" ] || missing+=("$b"); done
node_missing=()
for b in "${NODE_BINARIES[@]}"; do [ -x "$node_dir/$b" ] || node_missing+=("$b"); done

case "$mode" in
  print-dir) echo "$bin_dir"; exit 0 ;;
  print-node-dir)
    if [ -z "$node_dir" ]; then
      echo "build.sh: Go is needed to build the real node (or set KAI_RAY_NODE_BIN_DIR)" >&2
      exit 1
    fi
    echo "$node_dir"; exit 0 ;;
  check)
    if [ ${#missing[@]} -gt 0 ] || [ ! -d "$kuberay_dir/crd" ] || [ ${#node_missing[@]} -gt 0 ]; then
      echo "missing in $bin_dir: ${missing[*]:-}; in ${node_dir:-(no node dir)}:" \
        "${node_missing[*]:-}; ${KUBERAY_MODULE} assets: $kuberay_dir" >&2
      exit 1
    fi
    exit 0 ;;
esac

# KubeRay's CRDs and samples ship inside its Go module zip; copy them out of the read-only module
# cache so they survive `go clean -modcache`.
fetch_kuberay_assets() {
  [ -d "$kuberay_dir/crd" ] && [ -d "$kuberay_dir/samples" ] && return 0
  if ! command -v go >/dev/null; then
    echo "build.sh: Go is needed to fetch KubeRay's CRDs and samples (or set KAI_RAY_KUBERAY_DIR" \
      "to a directory with crd/ and samples/)" >&2
    exit 1
  fi
  echo "== KubeRay $KUBERAY_VERSION CRDs and samples (go mod download)"
  local dir
  dir="$(go mod download -json "$KUBERAY_MODULE@$KUBERAY_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  if [ -z "$dir" ] || [ ! -d "$dir/config/crd/bases" ]; then
    echo "build.sh: could not locate $KUBERAY_MODULE@$KUBERAY_VERSION in the module cache" >&2
    exit 1
  fi
  local tmp="$kuberay_dir.tmp.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  cp -r "$dir/config/crd/bases" "$tmp/crd"
  cp -r "$dir/config/samples" "$tmp/samples"
  chmod -R u+w "$tmp"
  echo "$dir" > "$tmp/MODULE_DIR"
  rm -rf "$kuberay_dir"; mv "$tmp" "$kuberay_dir"
}

if [ "$mode" = print-kuberay-dir ]; then
  [ -n "${KAI_RAY_KUBERAY_DIR:-}" ] || fetch_kuberay_assets >&2
  echo "$kuberay_dir"; exit 0
fi

if [ -n "${KAI_RAY_BIN_DIR:-}" ]; then
  if [ ${#missing[@]} -gt 0 ]; then
    echo "build.sh: KAI_RAY_BIN_DIR=$bin_dir lacks: ${missing[*]}" >&2
    exit 1
  fi
  [ -n "${KAI_RAY_KUBERAY_DIR:-}" ] || fetch_kuberay_assets
  echo "using binaries in KAI_RAY_BIN_DIR"
  missing=()
else
  check_pins
  fetch_kuberay_assets
fi

k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMajor=$(echo "$K8S_VERSION" | cut -d. -f1 | tr -d v)"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
k8s_ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"

build_one() {
  local name="$1"
  case "$name" in
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl)
      (cd "$here/k8s" && go build -trimpath -ldflags "$k8s_ldflags" -o "$stage/$name" "./cmd/$name") ;;
    etcd)
      (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$stage/etcd" .) ;;
    kwok)
      GOBIN="$stage" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" ;;
    ray-operator)
      (cd "$here/kuberay" && go build -trimpath -ldflags "-s -w" -o "$stage/ray-operator" \
        "$KUBERAY_MODULE") ;;
    helm)
      GOBIN="$stage" go install -trimpath \
        -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
        "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" ;;
    kubelet|kube-proxy)
      (cd "$here/node" && go build -trimpath -ldflags "$k8s_ldflags" -o "$stage/$name" "./cmd/$name") ;;
    gpu-device-plugin)
      (cd "$here/node" && go build -trimpath -ldflags "-s -w" -o "$stage/$name" ./gpu-device-plugin) ;;
    coredns)
      GOBIN="$stage" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION" ;;
    crictl)
      GOBIN="$stage" go install -trimpath \
        -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
        "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION" ;;
  esac
}

# build_into DIR NAME...: build each NAME into a staging dir under DIR, then move it in (a
# binary appears in the cache only once it is complete).
build_into() {
  local dir="$1"; shift
  [ $# -gt 0 ] || return 0
  mkdir -p "$dir"
  stage="$(mktemp -d "$dir/.build.XXXXXX")"
  echo "== building $# binaries into $dir"
  echo "   (cold: many minutes on 2 cores; Go's build cache makes reruns fast)"
  local total_start=$SECONDS name start
  for name in "$@"; do
    start=$SECONDS
    echo "-- $name ..."
    # A heartbeat, so a long cold build does not look hung.
    ( while sleep 30; do echo "   ... still building $name ($((SECONDS - start))s)"; done ) &
    ticker=$!
    if ! build_one "$name"; then
      echo "build.sh: building $name failed" >&2
      exit 1
    fi
    kill "$ticker" 2>/dev/null || true; wait "$ticker" 2>/dev/null || true; ticker=""
    mv "$stage/$name" "$dir/$name"
    echo "   built $name in $((SECONDS - start)) s"
  done
  rm -rf "$stage"; stage=""
  echo "== built $# binaries in $((SECONDS - total_start)) s"
}

stage=""
trap '[ -n "$stage" ] && rm -rf "$stage"; [ -n "${ticker:-}" ] && kill "$ticker" 2>/dev/null || true' EXIT

if [ ${#missing[@]} -eq 0 ]; then
  echo "all ${#BINARIES[@]} control-plane binaries present (nothing to do)"
else
  build_into "$bin_dir" "${missing[@]}"
fi
if [ -z "$node_dir" ]; then
  echo "build.sh: no Go, so no real-node binaries (set KAI_RAY_NODE_BIN_DIR to use built ones)" >&2
elif [ ${#node_missing[@]} -eq 0 ]; then
  echo "all ${#NODE_BINARIES[@]} real-node binaries present in $node_dir (nothing to do)"
elif [ -n "${KAI_RAY_NODE_BIN_DIR:-}" ]; then
  echo "build.sh: KAI_RAY_NODE_BIN_DIR=$node_dir lacks: ${node_missing[*]}" >&2
  exit 1
else
  build_into "$node_dir" "${node_missing[@]}"
fi
echo "$bin_dir"
