#!/usr/bin/env bash
# Installs the host packages that kai_ray/testing/images.py builds container images with, if
# missing: podman + runc (builds and saves images; crun, podman's default runtime, cannot run on
# a hybrid cgroup layout), mmdebstrap (the Debian base rootfs), busybox-static (the busybox
# image), gcc + libc6-dev (the static pause binary needs libc.a).
#
# Idempotent and quiet (apt-install.sh): nothing runs when every package is installed.
set -euo pipefail

PACKAGES=(podman runc mmdebstrap busybox-static gcc libc6-dev)
exec "$(dirname "$0")/apt-install.sh" image-build "${PACKAGES[@]}"
