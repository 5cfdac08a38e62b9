#!/usr/bin/env bash
# Installs the host packages a real kubelet node needs (kai_ray/testing/realnode.py), if missing:
# containerd + runc (the container runtime; crun cannot run on this hybrid cgroup layout), the
# CNI plugins (bridge, host-local and loopback, under /usr/lib/cni), iptables (kube-proxy
# and the kubelet write KUBE-* chains), conntrack (kube-proxy clears stale UDP entries with it),
# util-linux and mount (mount, umount, nsenter: the kubelet shells out to them).
#
# Idempotent and quiet (apt-install.sh): nothing runs when every package is installed.
set -euo pipefail

PACKAGES=(containerd runc containernetworking-plugins iptables conntrack util-linux mount)
exec "$(dirname "$0")/apt-install.sh" real-node "${PACKAGES[@]}"
