#!/usr/bin/env bash
# apt-install.sh WHAT PACKAGE...: installs the Debian packages that are missing, quietly; nothing
# runs when all are installed. WHAT names them in messages. Needs root and apt-get; elsewhere it
# says what to install and exits 1. Used by install-node-deps.sh and install-image-deps.sh.
set -euo pipefail
what="$1"; shift

missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null || [ "$(id -u)" -ne 0 ]; then
  echo "$what: need root and apt-get to install: ${missing[*]}" >&2
  exit 1
fi
echo "== installing $what packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
# policy-rc.d 101: packages must not start their services (no init system here; the real node
# starts its own containerd with its own config)
policy=/usr/sbin/policy-rc.d
own_policy=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; own_policy=1
fi
trap 'rm -f "$log"; if [ -n "$own_policy" ]; then rm -f "$policy"; fi' EXIT
# an install fails on a stale package list: refresh it once, only when something is missing
apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1 \
  || { cat "$log" >&2; exit 1; }
echo "   installed: ${missing[*]}"
