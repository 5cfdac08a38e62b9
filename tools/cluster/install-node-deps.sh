#!/usr/bin/env bash
# Installs the host packages a real kubelet node needs (kai_ray/testing/realnode.py), if missing:
# containerd + runc (the container runtime; crun cannot run on this hybrid cgroup layout), the
# CNI plugins (bridge, host-local and loopback, under /usr/lib/cni), iptables (kube-proxy
# and the kubelet write KUBE-* chains), conntrack (kube-proxy clears stale UDP entries with it),
# util-linux and mount (mount, umount, nsenter: the kubelet shells out to them).
#
# Idempotent and quiet: nothing runs when every package is already installed. Needs root and
# Debian/Ubuntu apt; elsewhere it says what to install and exits 1.
set -euo pipefail

PACKAGES=(containerd runc containernetworking-plugins iptables conntrack util-linux mount)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null || [ "$(id -u)" -ne 0 ]; then
  echo "install-node-deps.sh: need root and apt-get to install: ${missing[*]}" >&2
  exit 1
fi
echo "== installing node packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# an install fails on a stale package list: refresh it once, only when something is missing
log="$(mktemp)"
apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
# policy-rc.d 101: the packages must not try to start their services (no init system here;
# the node starts its own containerd with its own config)
policy=/usr/sbin/policy-rc.d
own_policy=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; own_policy=1
fi
trap 'rm -f "$log"; if [ -n "$own_policy" ]; then rm -f "$policy"; fi' EXIT
apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1 \
  || { cat "$log" >&2; exit 1; }
echo "   installed: ${missing[*]}"
