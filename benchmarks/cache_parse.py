"""What Python's cyclic garbage collector costs the cache's first list (no cluster needed).

Parses and trims `--pods` API-server-shaped pods (pages of 500, as `Informer._list` reads them:
`orjson.loads`, then `trim.trim_pod`) three ways: with the collector on, off (what `kai-ray run`
does while its cache lists), and on after `gc.freeze()` of what was listed before. A few pages are
kept alive beforehand, as the other kinds of a real cache are.

    python3 benchmarks/cache_parse.py [--pods 9000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import time
from typing import Any

import orjson

from kai_ray.k8s import trim

PAGE = 500


def api_pod(i: int) -> dict[str, Any]:
    """A pending pod as the API server lists it (managedFields, the service-account volume, the
    default tolerations), about 2 KB of JSON."""
    fields = {"f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:kai.scheduler/queue": {}}},
              "f:spec": {"f:containers": {'k:{"name":"c"}': {
                  ".": {}, "f:image": {}, "f:name": {}, "f:resources": {
                      ".": {}, "f:limits": {".": {}, "f:nvidia.com/gpu": {}},
                      "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}}}}},
                  "f:schedulerName": {}, "f:restartPolicy": {}}}
    volume = {"name": "kube-api-access-x", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt",
                                                               "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
            "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}
    return {
        "metadata": {"name": f"pod-{i}", "namespace": "bench", "uid": f"uid-{i:08d}",
                     "resourceVersion": str(1000 + i),
                     "creationTimestamp": "2026-11-27T12:00:00Z",
                     "labels": {"app": "x", "kai.scheduler/queue": "q"},
                     "managedFields": [{"manager": "python", "operation": "Update",
                                        "apiVersion": "v1", "time": "2026-11-27T12:00:00Z",
                                        "fieldsType": "FieldsV1", "fieldsV1": fields}]},
        "spec": {"volumes": [volume], "containers": [{
            "name": "c", "image": "registry.k8s.io/pause:3.10",
            "resources": {"limits": {"nvidia.com/gpu": "1"},
                          "requests": {"cpu": "100m", "memory": "128Mi",
                                       "nvidia.com/gpu": "1"}},
            "volumeMounts": [{"name": "kube-api-access-x", "readOnly": True,
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
            "schedulerName": "kai-scheduler", "priority": 0,
            "tolerations": [{"key": f"node.kubernetes.io/{k}", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}
                            for k in ("not-ready", "unreachable")]},
        "status": {"phase": "Pending", "qosClass": "Burstable"}}


def pages(count: int) -> list[bytes]:
    pods = [api_pod(i) for i in range(count)]
    return [orjson.dumps({"kind": "PodList", "metadata": {"resourceVersion": "1"},
                          "items": pods[i:i + PAGE]}) for i in range(0, count, PAGE)]


def list_once(listed: list[bytes]) -> tuple[float, list[dict[str, Any]]]:
    kept: list[dict[str, Any]] = []
    t = time.perf_counter()
    for page in listed:
        kept.extend(trim.trim_pod(o) for o in orjson.loads(page)["items"])
    return time.perf_counter() - t, kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=9000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    listed = pages(args.pods)
    others = [copy.deepcopy(orjson.loads(p)) for p in listed[:4]]  # the cache's other kinds
    def measured(mode: str) -> float:
        gc.collect()
        if mode == "gc off":
            gc.disable()
        elif mode == "gc on, frozen before":
            gc.freeze()
        try:
            seconds, _ = list_once(listed)
        finally:
            gc.enable()
            gc.unfreeze()
        return seconds

    modes = ("gc on", "gc off", "gc on, frozen before")
    times = {mode: [measured(mode) for _ in range(args.repeat)] for mode in modes}
    print(f"{args.pods} pods, {len(listed)} pages of {PAGE}, {len(others)} pages kept alive; "
          f"median of {args.repeat}")
    for name, values in times.items():
        print(f"  {name:22s} {statistics.median(values):.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
