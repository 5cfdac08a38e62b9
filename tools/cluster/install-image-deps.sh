#!/usr/bin/env bash
# Installs the host packages that kai_ray/testing/images.py builds container images with, if
# missing: podman + runc (builds and saves images; crun, podman's default runtime, cannot run on
# a hybrid cgroup layout), mmdebstrap (the Debian base rootfs), busybox-static (the busybox
# image), gcc + libc6-dev (the static pause binary needs libc.a).
#
# Idempotent and quiet: nothing runs when every package is already installed. Needs root and
# Debian/Ubuntu apt; elsewhere it says what to install and exits 1.
set -euo pipefail

PACKAGES=(podman runc mmdebstrap busybox-static gcc libc6-dev)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null || [ "$(id -u)" -ne 0 ]; then
  echo "install-image-deps.sh: need root and apt-get to install: ${missing[*]}" >&2
  exit 1
fi
echo "== installing image-build packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# an install fails on a stale package list: refresh it once, only when something is missing
apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1 \
  || { cat "$log" >&2; exit 1; }
echo "   installed: ${missing[*]}"
