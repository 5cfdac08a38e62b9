#!/usr/bin/env bash
# Builds the peer schedulers that benchmarks compare kai-ray with, from their Go modules (through
# the Go module proxy), into a cache directory keyed by the pinned versions; a second run builds
# nothing. Each peer's CRD yamls (and Volcano's Helm-chart scheduler config) are copied out of its
# module next to its binaries.
#
#   tools/peers/build.sh              build what is missing, print the dir last
#   tools/peers/build.sh PEER...      only these peers (kai-scheduler volcano coscheduling yunikorn)
#   tools/peers/build.sh --print-dir  print the dir only (builds nothing)
#   tools/peers/build.sh --check [PEER...]  exit 1 unless every (named) peer's files are present
#
# Environment: KAI_RAY_CACHE (cache root, default ~/.cache/kai-ray); KAI_RAY_PEERS_DIR (use peer
# binaries you already have in this directory, laid out as this script lays them out).
#
# Layout: kai-scheduler/{scheduler,binder,podgrouper,crds/}, volcano/{vc-scheduler,
# vc-controller-manager,volcano-scheduler.conf,crds/}, coscheduling/{kube-scheduler,controller,
# crds/}, yunikorn/yunikorn-scheduler (YuniKorn has no CRDs). Wrapper modules: tools/peers/<peer>/
# (why each exists: its go.mod). Not part of ./scripts/test or CI: a cold build compiles four
# schedulers and their Kubernetes libraries (about half an hour on 2 cores).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache_root="${KAI_RAY_CACHE:-$HOME/.cache/kai-ray}"
ALL_PEERS=(kai-scheduler volcano coscheduling yunikorn)
# the k8s.io libraries scheduler-plugins is built against (its go.mod): its version string
COSCHED_K8S_VERSION=v1.34.4

files_of() {  # what must exist for a peer to count as built
  case "$1" in
    kai-scheduler) echo "scheduler binder podgrouper crds" ;;
    volcano) echo "vc-scheduler vc-controller-manager volcano-scheduler.conf crds" ;;
    coscheduling) echo "kube-scheduler controller crds" ;;
    yunikorn) echo "yunikorn-scheduler" ;;
    *) echo "build.sh: unknown peer '$1' (${ALL_PEERS[*]})" >&2; exit 2 ;;
  esac
}

mode=build
peers=()
for arg in "$@"; do
  case "$arg" in
    --print-dir) mode=print-dir ;;
    --check) mode=check ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    -*) echo "build.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
    *) files_of "$arg" >/dev/null; peers+=("$arg") ;;
  esac
done
[ ${#peers[@]} -gt 0 ] || peers=("${ALL_PEERS[@]}")

# The key covers what decides the bytes: pinned versions, wrapper modules, the Go toolchain.
cache_key() {
  {
    cat "$here/versions.env"
    go env GOVERSION
    (cd "$here" && find kai volcano coscheduling yunikorn -type f \
      \( -name go.mod -o -name go.sum -o -name '*.go' \) | LC_ALL=C sort | xargs sha256sum)
  } | sha256sum | cut -c1-12
}

if [ -n "${KAI_RAY_PEERS_DIR:-}" ]; then
  dir="$KAI_RAY_PEERS_DIR"
elif command -v go >/dev/null; then
  dir="$cache_root/peers-$(cache_key)"
else
  echo "build.sh: Go is needed to build the peer schedulers (or set KAI_RAY_PEERS_DIR)" >&2
  exit 1
fi

missing_of() {
  local f out=()
  for f in $(files_of "$1"); do [ -e "$dir/$1/$f" ] || out+=("$f"); done
  echo "${out[*]:-}"
}

case "$mode" in
  print-dir) echo "$dir"; exit 0 ;;
  check)
    rc=0
    for p in "${peers[@]}"; do
      m="$(missing_of "$p")"
      if [ -n "$m" ]; then echo "missing in $dir/$p: $m" >&2; rc=1; fi
    done
    exit $rc ;;
esac
if [ -n "${KAI_RAY_PEERS_DIR:-}" ]; then
  echo "build.sh: KAI_RAY_PEERS_DIR is set: nothing is built" >&2
  exec "$0" --check "${peers[@]}"
fi

# The wrappers pin the same versions in their go.mod; refuse to build if they drifted.
for pin in "kai:github.com/NVIDIA/KAI-scheduler $KAI_SCHEDULER_VERSION" \
           "volcano:volcano.sh/volcano $VOLCANO_VERSION" \
           "volcano:volcano.sh/apis $VOLCANO_APIS_VERSION" \
           "coscheduling:sigs.k8s.io/scheduler-plugins $SCHEDULER_PLUGINS_VERSION" \
           "yunikorn:github.com/apache/yunikorn-k8shim $YUNIKORN_VERSION"; do
  if ! grep -qE "^(require )?[[:space:]]*${pin#*:}( |\$)" "$here/${pin%%:*}/go.mod"; then
    echo "build.sh: $here/${pin%%:*}/go.mod does not pin ${pin#*:} (versions.env)" >&2
    exit 1
  fi
done

# One package at a time: a cold build of four schedulers would otherwise hold both cores for long.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-p=1 -trimpath"
# The checksum database has no entry for the yunikorn modules; go.sum pins their hashes.
export GONOSUMDB="${GONOSUMDB:+$GONOSUMDB,}github.com/apache/yunikorn-*"

wrapper_of() { case "$1" in kai-scheduler) echo kai ;; *) echo "$1" ;; esac; }

module_dir() {  # a module's source in the module cache, as the peer's wrapper resolves it
  (cd "$here/$(wrapper_of "$1")" && go mod download "$2" && go list -m -f '{{.Dir}}' "$2")
}

# go_build PEER OUT PACKAGE [LDFLAGS]: build a main package the wrapper lists as a tool.
go_build() {
  local peer="$1" out="$2" pkg="$3" ldflags="${4:-}" start=$SECONDS ticker rc=0
  echo "-- $peer/$out ($pkg)"
  ( while sleep 60; do echo "   ... still building $peer/$out ($((SECONDS - start))s)"; done ) &
  ticker=$!
  (cd "$here/$(wrapper_of "$peer")" && go build -ldflags "-s -w $ldflags" -o "$stage/$out" "$pkg") \
    || rc=$?
  kill "$ticker" 2>/dev/null || true; wait "$ticker" 2>/dev/null || true
  [ $rc -eq 0 ] || { echo "build.sh: building $peer/$out failed" >&2; exit 1; }
  echo "   built $peer/$out in $((SECONDS - start)) s"
}

copy_out() {  # copy_out SRC DEST: a file or directory out of the read-only module cache
  cp -r "$1" "$stage/$2"
  chmod -R u+w "$stage/$2"
}

# make_file PEER FILE: produce one of files_of PEER into $stage.
make_file() {
  local peer="$1" f="$2" k8s_ldflags
  case "$peer/$f" in
    kai-scheduler/crds)
      copy_out "$(module_dir "$peer" github.com/NVIDIA/KAI-scheduler)/deployments/kai-scheduler/crds" crds ;;
    kai-scheduler/*)
      go_build "$peer" "$f" "github.com/NVIDIA/KAI-scheduler/cmd/$f" ;;
    volcano/crds)
      copy_out "$(module_dir "$peer" volcano.sh/volcano)/config/crd/volcano/bases" crds ;;
    volcano/volcano-scheduler.conf)  # what its Helm chart runs the scheduler with
      copy_out "$(module_dir "$peer" volcano.sh/volcano)/installer/helm/chart/volcano/config/volcano-scheduler.conf" \
        volcano-scheduler.conf ;;
    volcano/vc-scheduler)
      go_build "$peer" "$f" volcano.sh/volcano/cmd/scheduler ;;
    volcano/vc-controller-manager)
      go_build "$peer" "$f" volcano.sh/volcano/cmd/controller-manager ;;
    coscheduling/crds)
      copy_out "$(module_dir "$peer" sigs.k8s.io/scheduler-plugins)/config/crd/bases" crds ;;
    coscheduling/kube-scheduler)
      # a Kubernetes version string, as kube-scheduler checks its emulation version against it
      # (its own tag, v0.34.7, reads as Kubernetes 0.34 and the scheduler refuses to start)
      k8s_ldflags="-X k8s.io/component-base/version.gitVersion=$COSCHED_K8S_VERSION"
      k8s_ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
      k8s_ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "$COSCHED_K8S_VERSION" | cut -d. -f2)"
      go_build "$peer" "$f" sigs.k8s.io/scheduler-plugins/cmd/scheduler "$k8s_ldflags" ;;
    coscheduling/controller)
      go_build "$peer" "$f" sigs.k8s.io/scheduler-plugins/cmd/controller ;;
    yunikorn/yunikorn-scheduler)
      go_build "$peer" "$f" github.com/apache/yunikorn-k8shim/pkg/cmd/shim \
        "-X github.com/apache/yunikorn-k8shim/pkg/conf.buildVersion=$YUNIKORN_VERSION" ;;
  esac
}

stage=""
trap '[ -n "$stage" ] && rm -rf "$stage"' EXIT
for peer in "${peers[@]}"; do
  missing="$(missing_of "$peer")"
  if [ -z "$missing" ]; then
    echo "$peer: present in $dir/$peer (nothing to do)"
    continue
  fi
  echo "== $peer into $dir/$peer: $missing (cold: many minutes on 2 cores)"
  mkdir -p "$dir/$peer"
  for f in $missing; do
    # a file appears in the cache only once it is complete
    stage="$(mktemp -d "$dir/$peer/.build.XXXXXX")"
    make_file "$peer" "$f"
    mv "$stage/$f" "$dir/$peer/$f"
    rm -rf "$stage"; stage=""
  done
done
echo "$dir"
