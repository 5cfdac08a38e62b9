#!/bin/sh
# Entry point of the kai-ray image. The first argument picks the process:
#   scheduler ARGS...   kai-ray run (pod grouper, scheduling loop, binder, status) in cluster
#   webhook ARGS...     the admission webhook alone (TLS from the mounted Secret)
#   apply-crds          server-side apply of the CRDs (the chart's pre-upgrade hook)
# Anything else is passed to the kai-ray command unchanged (e.g. `queues`, `explain`).
set -eu
cmd="${1:-scheduler}"
[ "$#" -gt 0 ] && shift
case "$cmd" in
  scheduler) exec kai-ray run "$@" ;;
  webhook) exec kai-ray webhook "$@" ;;
  apply-crds) exec kai-ray apply-crds "$@" ;;
  *) exec kai-ray "$cmd" "$@" ;;
esac
